"""Plan a join: what it would write and run, nothing written.

`plan_runtime()` covers containerd + CDI (Ansible role container_runtime); `plan_join()` adds the
Kubernetes side (role kube_join; `nodeprep join`); nodeprep.join.apply applies either. The cluster
checks, kubelet arguments, kubeadm and kubelet files and their commands are pure planners over
explicit inputs; what they need from the node (token, CA file, labels, doctor, containerd's
version, whether it joined) is read by nodeprep.join.probe. A plan lists every file with its
rendered bytes and `changed`, and the commands an apply would run; check mode calls only the plan.
The bootstrap token only ever appears inside files marked `secret` (0600); `to_dict()` and
`render_text()` mask it.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError, StateError
from ..health import unit as healthunit
from ..kubeletflags import SortedArgs, check_version, sort_args
from ..profile import Cluster, Profile
from ..profile.load import CA_PIN_REQUIRED
from ..profile.model import Health
from . import cdi as cdimod
from . import containerd as ctd
from . import ctkconfig, enablement, kube, ocihooks, probe
from . import gpus as gpumod
from .discovery import Discovery
from .files import FileChange, under
from .token import BootstrapToken, redact

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
    warnings += containerd_version_warnings(probe.containerd_version(profile, live=options.live))
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


def containerd_version_warnings(version: str | None) -> list[str]:
    """What `containerd --version` output (None: not asked) says about CDI: containerd before 1.7
    ignores enable_cdi."""
    for word in (version or "").split():
        parts = word.lstrip("v").split(".")
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            if (int(parts[0]), int(parts[1])) < (1, 7):
                return [
                    f"containerd {word} ignores enable_cdi (CDI needs containerd 1.7 or newer); the nvidia "
                    "runtime still works"
                ]
            return []
    return []


# ---------------------------------------------------------------------------------------------
# Join: pure planners (explicit inputs), then plan_join, which feeds them what nodeprep.join.probe read


def needs_ca_cert_file(profile: Profile, *, insecure: bool) -> bool:
    """Mode kubelet trusts cluster.ca_cert_file (kubeadm pins the CA by hash instead)."""
    return profile.cluster is not None and profile.cluster.mode == "kubelet" and not insecure


def checked_cluster(profile: Profile, *, insecure: bool, ca_cert_present: bool | None) -> Cluster:
    """The profile's cluster section, refused (InputError) without one, for kubeadm without CA pins
    and for kubelet without its CA file (`ca_cert_present`; None: not looked at, not needed)."""
    cluster = profile.cluster
    if cluster is None:
        raise InputError(
            f"{profile.source}: no cluster section; nothing to join",
            hint="add cluster: {api_server: HOST:PORT, ...} (see examples/node.yaml)",
        )
    if not cluster.ca_cert_hashes and not insecure and cluster.mode == "kubeadm":
        raise InputError(f"{profile.source}: {CA_PIN_REQUIRED}",
                         hint="or pass --insecure-skip-ca-verification to trust the network")
    if needs_ca_cert_file(profile, insecure=insecure) and ca_cert_present is False:
        raise InputError(
            f"cluster.ca_cert_file: {cluster.ca_cert_file} does not exist",
            hint="copy the cluster CA certificate there, or pass --insecure-skip-ca-verification",
        )
    return cluster


def kubelet_args(profile: Profile, cluster: Cluster) -> tuple[SortedArgs, list[str]]:
    """The kubelet's flags and configuration fields for the cluster's version (the CDI feature gate
    where CDI needs it), with the warnings they raise. InputError for a refused flag."""
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
    return args, warnings


def registration_labels(labels: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(labels the kubelet registers with, labels that need an API write, the warning naming those).
    labels.extra holds only labels a kubelet may register with: the profile's own validation refuses
    the others (nodeprep.profile.checks.label_pair), for every command that reads a profile."""
    from ..labels.validate import split_for_kubelet

    mine, api = split_for_kubelet(dict(labels))
    if not api:
        return mine, api, []
    return mine, api, ["not set at registration (need an API write, e.g. nodeprep labels --apply): "
                       + ", ".join(sorted(api))]


def kubeadm_files(root: Path, cluster: Cluster, token: BootstrapToken, labels: Mapping[str, str],
                  args: SortedArgs, *, insecure: bool) -> tuple[list[FileChange], str]:
    """The JoinConfiguration (secret: it holds the token) and the kubelet patch; the kubeadm API."""
    doc = kube.join_configuration(cluster, token, labels=labels, args=args,
                                  insecure_skip_ca_verification=insecure)
    files = [
        FileChange(under(root, kube.JOIN_CONFIG), kube.JOIN_CONFIG, kube.dump(doc), 0o600, secret=True),
        FileChange(under(root, kube.KUBELET_PATCH), kube.KUBELET_PATCH,
                   kube.dump(kube.kubelet_patch(cluster, args)), 0o644),
    ]
    return files, doc["apiVersion"]


def kubeadm_actions(root: Path, *, joined: bool, live: bool) -> tuple[list[Action], list[str]]:
    """`kubeadm join` unless the node has joined; deferred to the booted node for an image root."""
    if joined:
        return [], [f"{kube.KUBECONFIG} exists: the node has already joined; not running kubeadm join"]
    action = Action(("kubeadm", "join", "--config", kube.JOIN_CONFIG), "join the cluster", deferred=not live)
    if live:
        return [action], []
    return [action], [f"--root {root}: not running kubeadm join; run `kubeadm join --config "
                      f"{kube.JOIN_CONFIG}` on the booted node"]


def kubelet_files(root: Path, cluster: Cluster, token: BootstrapToken, labels: Mapping[str, str],
                  args: SortedArgs, *, insecure: bool) -> list[FileChange]:
    """Mode kubelet: the bootstrap kubeconfig (secret), KubeletConfiguration and the systemd drop-in."""
    kubeconfig = kube.bootstrap_kubeconfig(cluster, token, insecure=insecure)
    return [
        FileChange(under(root, kube.BOOTSTRAP_KUBECONFIG), kube.BOOTSTRAP_KUBECONFIG, kube.dump(kubeconfig),
                   0o600, secret=True),
        FileChange(under(root, kube.KUBELET_CONFIG), kube.KUBELET_CONFIG,
                   kube.dump(kube.kubelet_configuration(cluster, args, standalone=True)), 0o644),
        FileChange(under(root, kube.KUBELET_DROP_IN), kube.KUBELET_DROP_IN,
                   kube.kubelet_drop_in(cluster, labels, args).encode(), 0o644),
    ]


def kubelet_actions(root: Path, *, changed: bool, joined: bool, live: bool) -> list[Action]:
    """Mode kubelet: reload and (re)start kubelet when its files `changed` or it has not joined; an
    image root only enables it (it bootstraps at first boot)."""
    if not live:  # SYSTEMCTL_SKIP_SYSV: never `chroot ROOT update-rc.d` for an image's init.d script
        return [Action(("env", "SYSTEMCTL_SKIP_SYSV=1", "systemctl", f"--root={root}", "enable",
                        "kubelet.service"), "offline root: kubelet starts and bootstraps at first boot")]
    actions = []
    if changed:
        actions += [
            Action(("systemctl", "daemon-reload"), "kubelet drop-in changed"),
            Action(("systemctl", "enable", "kubelet.service"), "start kubelet at boot"),
        ]
    if changed or not joined:
        actions.append(Action(("systemctl", "restart", "kubelet.service"),
                              "kubelet bootstraps with the new configuration"))
    return actions


def health_files(root: Path, health: Health | None = None) -> list[FileChange]:
    """The GPU health service's unit and the kubelet drop-in that wants it (nodeprep.health.unit), with
    the profile's health.hold; none when health.enabled is false."""
    health = health or Health()
    if not health.enabled:
        return []
    return [FileChange(under(root, target), target, content, 0o644)
            for target, content in healthunit.files(hold=float(health.hold))]


def health_actions(*, changed: bool, live: bool) -> list[Action]:
    """On a live node whose health unit changed: reload systemd and (re)start the service (after the
    join: it needs the kubelet's kubeconfig, and retries until that is there). An image root needs
    nothing: the kubelet wants the service at first boot."""
    if not (live and changed):
        return []
    return [Action(("systemctl", "daemon-reload"), "GPU health unit changed"),
            Action(("systemctl", "restart", healthunit.UNIT), "GPU health service (nodeprep health --watch)")]


def plan_join(profile: Profile, options: JoinOptions | None = None) -> JoinPlan:
    """Everything a join would write and run. Raises InputError for bad input (token, CA pins,
    flags, labels); preflight problems are returned in `plan.preflight`, not raised."""
    options = options or JoinOptions()
    root, insecure = Path(options.root), options.insecure_skip_ca_verification
    needs_ca = needs_ca_cert_file(profile, insecure=insecure)
    cluster = checked_cluster(profile, insecure=insecure, ca_cert_present=(
        probe.ca_cert_present(root, profile.cluster) if needs_ca and profile.cluster else None))
    token = options.token or probe.token(root, cluster)
    args, warnings = kubelet_args(profile, cluster)
    label_warnings: list[str]
    if options.labels is not None:
        labels, label_warnings = dict(options.labels), []
    else:
        labels, label_warnings = probe.node_labels(profile, root, nvidia_smi_xml=options.nvidia_smi_xml)
    mine, api, split_warnings = registration_labels(labels)
    runtime = plan_runtime(profile, options)
    warnings += label_warnings + split_warnings + list(runtime.warnings)
    joined = probe.joined(root)
    api_version: str | None = None
    if cluster.mode == "kubeadm":
        files, api_version = kubeadm_files(root, cluster, token, mine, args, insecure=insecure)
        actions, join_warnings = kubeadm_actions(root, joined=joined, live=options.live)
    else:
        files, join_warnings = kubelet_files(root, cluster, token, mine, args, insecure=insecure), []
        changed = any(f.changed for f in files)
        actions = kubelet_actions(root, changed=changed, joined=joined, live=options.live)
        record = enablement.record_change(root) if any("enable" in a.argv for a in actions) else None
        files += [record] if record else []  # written before the enable runs
    health = health_files(root, profile.health)
    files += health
    actions += health_actions(changed=any(f.changed for f in health), live=options.live)
    preflight = list(runtime.preflight) + ([] if options.skip_preflight else probe.doctor_problems(root))
    discovery = None
    if options.discovery and not joined:
        discovery = Discovery(cluster.api_server, tuple(cluster.ca_cert_hashes),
                              probe.ca_cert_pem(root, cluster) if needs_ca else None, insecure,
                              options.discovery_timeout)
    return JoinPlan(
        mode=cluster.mode,
        kubernetes_version=cluster.kubernetes_version,
        kubeadm_api=api_version,
        files=(*runtime.files, *files),
        actions=(*runtime.actions, *actions),
        labels=mine,
        api_labels=api,
        taints=tuple(str(t) for t in cluster.all_taints),
        moved_flags=args.moved,
        warnings=tuple(warnings + join_warnings),
        preflight=tuple(preflight),
        token=token,
        already_joined=joined,
        discovery=discovery,
    )
