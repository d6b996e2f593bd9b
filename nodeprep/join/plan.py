"""Join a node: plan (pure apart from reading the node), preflight, apply.

`plan_runtime()` / `apply_runtime()` cover containerd + CDI (Ansible role container_runtime);
`plan_join()` / `apply_join()` add the Kubernetes side (role kube_join; `nodeprep join`). A plan
lists every file with its rendered bytes and `changed`, and the commands an apply would run; check
mode calls only plan(). The bootstrap token only ever appears inside files marked `secret` (0600);
`to_dict()` and `render_text()` mask it.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import runner
from ..errors import InputError, StateError
from ..kubeletflags import SortedArgs, check_version, sort_args
from ..log import step
from ..profile import Profile
from ..profile.load import CA_PIN_REQUIRED
from . import cdi as cdimod
from . import containerd as ctd
from . import ctkconfig, kube, ocihooks
from . import gpus as gpumod
from .discovery import Discovery, discover
from .files import FileChange, apply_changes, relocated, under
from .token import BootstrapToken, read_token_file, redact

log = logging.getLogger(__name__)

# KEP-4009 (CDI devices in the device plugin API): alpha 1.28, beta and on by default 1.29, GA 1.31.
CDI_GATE = "DevicePluginCDIDevices"
CDI_GATE_FROM = (1, 28)  # the kubelet refuses a gate it does not know (1.27 does not know this one)
CDI_GATE_DEFAULT_ON = (1, 29)


@dataclass(frozen=True)
class JoinOptions:
    root: Path = Path("/")
    insecure_skip_ca_verification: bool = False
    skip_preflight: bool = False
    nvidia_smi_xml: Path | None = None  # GPU facts from a capture (offline image builds, tests)
    labels: Mapping[str, str] | None = None  # precomputed labels; default: nodeprep.labels.core.node_labels
    # a token not (yet) in cluster.token_file: a check-mode plan uses the one it would write there
    token: BootstrapToken | None = None
    # check token and CA against the cluster's cluster-info before writing (apply with run=True);
    # off for offline image builds where the API server cannot be reached (--skip-discovery)
    discovery: bool = True
    discovery_timeout: float = 60.0
    # a plan to show (--check, Ansible check mode), never applied: what would stop an apply (no
    # active driver for the CDI spec yet) is a finding in `preflight`, not an error
    check: bool = False
    # where the CDI spec's device nodes and daemon sockets are looked up (default: root)
    dev_root: Path | None = None

    @property
    def live(self) -> bool:
        return Path(self.root).resolve() == Path("/")


@dataclass(frozen=True)
class Action:
    """A command an apply runs after writing files (argv never holds a secret)."""

    argv: tuple[str, ...]
    why: str
    deferred: bool = False  # offline --root: to be run on the booted node, not by apply

    def __str__(self) -> str:
        return " ".join(self.argv)


@dataclass(frozen=True)
class RuntimePlan:
    files: tuple[FileChange, ...]
    actions: tuple[Action, ...]
    warnings: tuple[str, ...]
    gpu_source: str
    preflight: tuple[str, ...] = ()  # what stops an apply, found by a check plan (JoinOptions.check)

    @property
    def changed(self) -> bool:
        return any(f.changed for f in self.files)


@dataclass(frozen=True)
class JoinPlan:
    mode: str
    kubernetes_version: str
    kubeadm_api: str | None
    files: tuple[FileChange, ...]
    actions: tuple[Action, ...]
    labels: dict[str, str]  # set by the kubelet at registration
    api_labels: dict[str, str]  # need an API write after the join (not requested by the user)
    taints: tuple[str, ...]
    moved_flags: tuple[str, ...]
    warnings: tuple[str, ...]
    preflight: tuple[str, ...]  # problems found (empty: ready)
    token: BootstrapToken = field(repr=False)
    already_joined: bool = False
    discovery: Discovery | None = None  # checked by apply_join(run=True) before anything is written

    @property
    def changed(self) -> bool:
        return any(f.changed for f in self.files) or any(not a.deferred for a in self.actions)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary; no secret content, the token masked."""
        return {
            "mode": self.mode,
            "kubernetes_version": self.kubernetes_version,
            "kubeadm_api": self.kubeadm_api,
            "changed": self.changed,
            "already_joined": self.already_joined,
            "files": [f.summary() for f in self.files],
            "commands": [list(a.argv) for a in self.actions if not a.deferred],
            "deferred_commands": [list(a.argv) for a in self.actions if a.deferred],
            "labels": self.labels,
            "api_labels": self.api_labels,
            "taints": list(self.taints),
            "moved_flags": list(self.moved_flags),
            "warnings": list(self.warnings),
            "preflight": list(self.preflight),
            "token": self.token.masked,
        }

    def render_text(self) -> str:
        """Every file with its content (secrets masked) and the commands, for --dry-run."""
        out = []
        for f in self.files:
            before = f.before
            state = "new" if before is None else ("changed" if f.changed else "unchanged")
            out.append(f"# ---- {f.target} (mode {f.mode:04o}, {state}{', secret' if f.secret else ''})")
            after = redact(f.content.decode("utf-8", "replace"), self.token)
            if f.program:  # generated code: its header says what and which nodeprep wrote it
                out += [*after.splitlines()[:4], f"# ({len(f.content)} bytes, generated by nodeprep)"]
            elif before is None or (f.secret and before != f.content):
                out.append(after.rstrip("\n"))  # a secret's old content (an older token) is never shown
            elif before != f.content:
                old = redact(before.decode("utf-8", "replace"), self.token)
                out += [
                    line.rstrip("\n")
                    for line in difflib.unified_diff(
                        old.splitlines(keepends=True),
                        after.splitlines(keepends=True),
                        fromfile=f"{f.target} (now)",
                        tofile=f"{f.target} (nodeprep)",
                    )
                ]
        for problem in self.preflight:
            out.append(f"# preflight (a real join refuses): {problem}")
        for a in self.actions:
            when = "on the booted node, run" if a.deferred else "would run"
            out.append(f"# {when}: {a}  ({a.why})")
        if not self.actions:
            out.append("# would run: nothing")
        return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# Runtime (containerd + CDI)


def plan_runtime(profile: Profile, options: JoinOptions | None = None) -> RuntimePlan:
    options = options or JoinOptions()
    root = Path(options.root)
    warnings: list[str] = []
    findings: list[str] = []
    gated = profile.runtime.cdi or profile.runtime.nvidia_runtime  # GPUs reach containers: the CUDA gate
    files = ctd.plan_containerd(root, profile.runtime, profile.cluster, warnings,
                                ocihooks.gate_hook() if gated else None)
    files += ctkconfig.plan_ctk_config(root, profile.runtime)
    if gated:
        try:
            files += ocihooks.plan_hooks_d(root)
        except StateError as e:
            if not options.check:
                raise
            findings.append(f"CUDA gate: {e}")
    source = "none"
    if profile.runtime.cdi:
        gpus = gpumod.discover(root, nvidia_smi_xml=options.nvidia_smi_xml)
        warnings += gpus.warnings
        source = gpus.source
        if not gpus.gpus and not options.live:
            warnings.append(
                f"--root {root}: no GPUs to list (no driver procfs, no NVIDIA PCI devices, no "
                "--nvidia-smi-xml): CDI spec not written; `nodeprep runtime` writes it on the booted node"
            )
        else:
            try:
                files += cdimod.plan_cdi(root, profile.driver, profile.runtime, gpus,
                                         dev_root=options.dev_root)
            except StateError as e:
                if not options.check:
                    raise
                findings.append(f"CDI spec: {e}")
    warnings += _containerd_version_warnings(profile, options)
    if profile.runtime.nvidia_runtime:
        missing = ctd.missing_runtime_warning(root, profile.runtime.nvidia_runtime_path)
        warnings += [missing] if missing else []
    actions: list[Action] = []
    if any(f.changed for f in files if "containerd" in f.target) and options.live:
        actions.append(
            Action(("systemctl", "restart", "containerd.service"), "containerd configuration changed")
        )
    files = list({f.target: f for f in files}.values())  # the hook program: the gate's and the spec's
    return RuntimePlan(tuple(files), tuple(actions), tuple(warnings), source, tuple(findings))


def _containerd_version_warnings(profile: Profile, options: JoinOptions) -> list[str]:
    if not (profile.runtime.cdi and options.live and runner.which("containerd")):
        return []
    try:
        out = runner.run(["containerd", "--version"], timeout=10, check=False).stdout
    except Exception:  # noqa: BLE001 - a version probe must never break a join
        return []
    for word in out.split():
        parts = word.lstrip("v").split(".")
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            if (int(parts[0]), int(parts[1])) < (1, 7):
                return [
                    f"containerd {word} ignores enable_cdi (CDI needs containerd 1.7 or newer); the nvidia "
                    "runtime still works"
                ]
            return []
    return []


def apply_runtime(plan: RuntimePlan) -> dict[str, Any]:
    if plan.preflight:
        raise StateError("; ".join(plan.preflight), hint="a check plan is shown, never applied")
    written = apply_changes(list(plan.files))
    ran = _run_actions(plan.actions)
    return {
        "changed": bool(written) or bool(ran),
        "written": [f.target for f in written],
        "ran": [list(a.argv) for a in ran],
        "warnings": list(plan.warnings),
    }


# ---------------------------------------------------------------------------------------------
# Join


def _labels(profile: Profile, options: JoinOptions) -> tuple[dict[str, str], list[str]]:
    """All labels for this node: `options.labels` if given, else nodeprep.labels.core.node_labels()."""
    if options.labels is not None:
        return dict(options.labels), []
    from ..labels.core import LabelOptions, node_labels

    root = Path(options.root)
    live = options.live
    opts = LabelOptions(
        root=root,
        kernel=profile.driver.kernel,  # else the running kernel on /, the root's kernel under --root
        sysfs_root=Path("/sys") if live else root / "sys",
        nvidia_smi_xml=options.nvidia_smi_xml,
        cloud=profile.labels.cloud,
        extra=dict(profile.labels.extra),
        run_nvidia_smi=live,
        use_nvml=live,
    )
    result = node_labels(opts)
    return dict(result.labels), list(result.warnings)


def _split_labels(labels: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    # labels.extra holds only labels a kubelet may register with: the profile's own validation
    # refuses the others (nodeprep.profile.checks.label_pair), for every command that reads a profile.
    from ..labels.validate import split_for_kubelet

    return split_for_kubelet(labels)


def _preflight(profile: Profile, options: JoinOptions) -> list[str]:
    try:
        from ..node.doctor import doctor  # type: ignore[import-not-found]
    except ImportError:
        return ["nodeprep.node.doctor is not available in this installation"]
    report = doctor(Path(options.root))
    if getattr(report, "ok", False):
        return []
    problems = getattr(report, "problems", None)
    details = problems() if callable(problems) else (problems or [])
    text = (
        "; ".join(f"{getattr(c, 'name', '?')}: {getattr(c, 'message', c)}" for c in details)
        or "see `nodeprep doctor`"
    )
    return [f"nodeprep doctor failed: {text}"]


def plan_join(profile: Profile, options: JoinOptions | None = None) -> JoinPlan:
    """Everything a join would write and run. Raises InputError for bad input (token, CA pins,
    flags, labels); preflight problems are returned in `plan.preflight`, not raised."""
    options = options or JoinOptions()
    cluster = profile.cluster
    if cluster is None:
        raise InputError(
            f"{profile.source}: no cluster section; nothing to join",
            hint="add cluster: {api_server: HOST:PORT, ...} (see examples/node.yaml)",
        )
    root = Path(options.root)
    if not cluster.ca_cert_hashes and not options.insecure_skip_ca_verification and cluster.mode == "kubeadm":
        raise InputError(f"{profile.source}: {CA_PIN_REQUIRED}",
                         hint="or pass --insecure-skip-ca-verification to trust the network")
    if (
        cluster.mode == "kubelet"
        and not options.insecure_skip_ca_verification
        and not under(root, cluster.ca_cert_file).is_file()
    ):
        raise InputError(
            f"cluster.ca_cert_file: {cluster.ca_cert_file} does not exist",
            hint="copy the cluster CA certificate there, or pass --insecure-skip-ca-verification",
        )
    token = options.token or read_token_file(
        under(root, cluster.token_file, input_field="cluster.token_file"), shown_as=cluster.token_file
    )
    warnings = check_version(cluster.minor)
    gates = dict(cluster.feature_gates)
    if profile.runtime.cdi and CDI_GATE_FROM <= cluster.minor < CDI_GATE_DEFAULT_ON and CDI_GATE not in gates:
        gates[CDI_GATE] = True
        warnings.append(
            f"enabled kubelet feature gate {CDI_GATE} (alpha in 1.28, on by default from 1.29) so the "
            "device plugin can hand CDI devices to containerd"
        )
    args: SortedArgs = sort_args(cluster.kubelet_extra_args, cluster.minor, feature_gates=gates)
    if args.moved:
        warnings.append("moved deprecated kubelet flags into KubeletConfiguration: " + ", ".join(args.moved))

    labels, label_warnings = _labels(profile, options)
    warnings += label_warnings
    mine, api = _split_labels(labels)
    if api:
        warnings.append(
            "not set at registration (need an API write, e.g. nodeprep labels --apply): "
            + ", ".join(sorted(api))
        )

    runtime = plan_runtime(profile, options)
    warnings += runtime.warnings
    files: list[FileChange] = list(runtime.files)
    actions: list[Action] = list(runtime.actions)
    already = under(root, kube.KUBECONFIG).exists()
    api_version: str | None = None
    if cluster.mode == "kubeadm":
        doc = kube.join_configuration(
            cluster,
            token,
            labels=mine,
            args=args,
            insecure_skip_ca_verification=options.insecure_skip_ca_verification,
        )
        api_version = doc["apiVersion"]
        files.append(
            FileChange(under(root, kube.JOIN_CONFIG), kube.JOIN_CONFIG, kube.dump(doc), 0o600, secret=True)
        )
        files.append(
            FileChange(
                under(root, kube.KUBELET_PATCH),
                kube.KUBELET_PATCH,
                kube.dump(kube.kubelet_patch(cluster, args)),
                0o644,
            )
        )
        if already:
            warnings.append(
                f"{kube.KUBECONFIG} exists: the node has already joined; not running kubeadm join"
            )
        else:
            actions.append(
                Action(
                    ("kubeadm", "join", "--config", kube.JOIN_CONFIG),
                    "join the cluster",
                    deferred=not options.live,
                )
            )
            if not options.live:
                warnings.append(
                    f"--root {root}: not running kubeadm join; run `kubeadm join --config "
                    f"{kube.JOIN_CONFIG}` on the booted node"
                )
    else:
        kubeconfig = kube.bootstrap_kubeconfig(cluster, token, insecure=options.insecure_skip_ca_verification)
        files += [
            FileChange(
                under(root, kube.BOOTSTRAP_KUBECONFIG),
                kube.BOOTSTRAP_KUBECONFIG,
                kube.dump(kubeconfig),
                0o600,
                secret=True,
            ),
            FileChange(
                under(root, kube.KUBELET_CONFIG),
                kube.KUBELET_CONFIG,
                kube.dump(kube.kubelet_configuration(cluster, args, standalone=True)),
                0o644,
            ),
            FileChange(
                under(root, kube.KUBELET_DROP_IN),
                kube.KUBELET_DROP_IN,
                kube.kubelet_drop_in(cluster, mine, args).encode(),
                0o644,
            ),
        ]
        kube_changed = any(f.changed for f in files[-3:])
        if options.live:
            if kube_changed:
                actions += [
                    Action(("systemctl", "daemon-reload"), "kubelet drop-in changed"),
                    Action(("systemctl", "enable", "kubelet.service"), "start kubelet at boot"),
                ]
            if kube_changed or not already:
                actions.append(
                    Action(
                        ("systemctl", "restart", "kubelet.service"),
                        "kubelet bootstraps with the new configuration",
                    )
                )
        else:
            actions.append(
                Action(
                    ("systemctl", f"--root={root}", "enable", "kubelet.service"),
                    "offline root: kubelet starts and bootstraps at first boot",
                )
            )
    preflight = list(runtime.preflight) + ([] if options.skip_preflight else _preflight(profile, options))
    discovery = None
    if options.discovery and not already:
        ca_pem = None
        if cluster.mode == "kubelet" and not options.insecure_skip_ca_verification:
            ca_pem = under(root, cluster.ca_cert_file).read_bytes()
        discovery = Discovery(cluster.api_server, tuple(cluster.ca_cert_hashes), ca_pem,
                              options.insecure_skip_ca_verification, options.discovery_timeout)
    return JoinPlan(
        mode=cluster.mode,
        kubernetes_version=cluster.kubernetes_version,
        kubeadm_api=api_version,
        files=tuple(files),
        actions=tuple(actions),
        labels=mine,
        api_labels=api,
        taints=tuple(str(t) for t in cluster.all_taints),
        moved_flags=args.moved,
        warnings=tuple(warnings),
        preflight=tuple(preflight),
        token=token,
        already_joined=already,
        discovery=discovery,
    )


def _run_actions(actions: tuple[Action, ...]) -> list[Action]:
    ran = []
    for a in actions:
        if a.deferred:
            continue
        with step(f"{a.why}: {a}", logger=log):
            runner.run(list(a.argv), timeout=900, capture=False)
        ran.append(a)
    return ran


def apply_join(plan: JoinPlan, *, run: bool = True) -> dict[str, Any]:
    """Write the planned files; then run the planned commands unless `run` is False (--dry-run).
    Refuses (StateError) when preflight found problems; with `run`, first checks the token and CA
    against the cluster (nodeprep.join.discovery) and refuses (one line, nothing written) when they
    do not hold."""
    if plan.preflight:
        raise StateError(
            "preflight failed: " + "; ".join(plan.preflight),
            hint="fix it (nodeprep doctor) or pass --skip-preflight",
        )
    result = plan.to_dict()  # before writing: `changed` describes what this apply does
    if run and plan.discovery is not None:
        with step(f"check token and CA against {plan.discovery.api_server}", logger=log):
            info = discover(plan.discovery, plan.token)
        result["discovery"] = {"server": info.server, "ca_pin": info.ca_pin}
    written = apply_changes(list(plan.files))
    ran = _run_actions(plan.actions) if run else []
    result.update(
        {
            "written": [f.target for f in written],
            "ran": [list(a.argv) for a in ran],
            "changed": bool(written) or bool(ran),
        }
    )
    return result


def preview_join(plan: JoinPlan, output_dir: Path | None = None) -> dict[str, Any]:
    """A dry run: the plan's summary; nothing on the node is written and nothing runs. With
    `output_dir`, the files are written under that directory (as they would lie under the root).
    Preflight findings are part of the plan (`preflight`), not a refusal: a plan can be shown on any
    machine; only apply_join refuses."""
    result = plan.to_dict()
    placed = relocated(list(plan.files), output_dir) if output_dir is not None else []
    apply_changes(placed)
    result.update({"written": [], "ran": [], "preview": [str(f.path) for f in placed]})
    return result


def join(
    profile: Profile, options: JoinOptions | None = None, *, dry_run: bool = False
) -> tuple[JoinPlan, dict[str, Any]]:
    """plan_join + apply_join: the whole `nodeprep join`."""
    plan = plan_join(profile, options)
    return plan, apply_join(plan, run=not dry_run)
