"""Plan the container runtime's configuration: what `nodeprep runtime` would write and run (containerd's
drop-in, NVIDIA Container Toolkit's config, hooks.d, the CDI spec and the hook program), nothing
written. nodeprep.runtime.configure applies it; nodeprep.join.joinplan adds the Kubernetes side. What it
reads from the node beyond the files: containerd's version (containerd_version)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import runner
from ..errors import StateError
from ..profile import Profile
from . import cdi as cdimod
from . import containerd as ctd
from . import ctkconfig, ocihooks
from . import gpus as gpumod
from .files import FileChange


@dataclass(frozen=True)
class RuntimeOptions:
    """Where and how the runtime is planned (nodeprep.join.joinplan.JoinOptions adds the join's)."""

    root: Path = Path("/")
    nvidia_smi_xml: Path | None = None  # GPU facts from a capture (offline image builds, tests)
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
    preflight: tuple[str, ...] = ()  # what stops an apply, found by a check plan (options.check)

    @property
    def changed(self) -> bool:
        return any(f.changed for f in self.files)


def plan_runtime(profile: Profile, options: RuntimeOptions | None = None) -> RuntimePlan:
    """What configuring the runtime would write and run (nothing written)."""
    options = options or RuntimeOptions()
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
    warnings += containerd_version_warnings(containerd_version(profile, live=options.live))
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


def containerd_version(profile: Profile, *, live: bool) -> str | None:
    """`containerd --version` of the running system when the profile enables CDI; None when not
    asked (an image root, no CDI, no containerd) or when it fails (a probe never breaks a join)."""
    if not (profile.runtime.cdi and live and runner.which("containerd")):
        return None
    try:
        return runner.run(["containerd", "--version"], timeout=10, check=False).stdout
    except Exception:  # noqa: BLE001 - a version probe must never break a join
        return None
