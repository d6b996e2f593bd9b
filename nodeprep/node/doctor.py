"""`nodeprep doctor`: is the active driver usable on this node? One check per concern.

Checks (names usable in `checks=`):
- state:    a version is active and its root is complete
- gpu:      an NVIDIA PCI device is present (ROOT/sys/bus/pci/devices/*/vendor == 0x10de)
- module:   the loaded kernel module's version (ROOT/sys/module/nvidia/version or
            ROOT/proc/driver/nvidia/version) equals the active user space's; a difference is the
            "Driver/library version mismatch" NVML/CUDA would report
- kmod:     the active version has modules for the running kernel (live systems only)
- devices:  /dev/nvidiactl, /dev/nvidia<N>, /dev/nvidia-uvm(-tools) exist (when the driver is loaded)
- ldcache:  ROOT/etc/ld.so.cache resolves libcuda.so.1 and libnvidia-ml.so.1 into the active root
- cuda:     `require_cuda` (a CUDA version or an NVIDIA_REQUIRE_CUDA expression) is satisfied by the
            active driver (nodeprep.cuda.check_requirement, the same code as the container hook)
- support:  the active version and flavour support every NVIDIA GPU of the node (its
            supported-GPU list against the PCI ids in ROOT/sys; nodeprep.node.support)
- hooks:    no container hook on the node (nodeprep's, NVIDIA's, another tool's) would be started
            with a container's environment (`inheriting_hooks`, nodeprep.runtime.hookaudit, passed in by the
            front-ends as join's activation callbacks are; without it: skipped)
A node without a GPU, or with a GPU but no loaded driver, is reported as such (gpu / module), and
the checks that depend on a loaded driver are then skipped rather than failed.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import cuda
from ..errors import CommandError, InputError
from ..pci import DISPLAY_CLASS, nvidia_devices
from ..sysfs import read_attr
from . import integration, support
from .devices import parse_gpu_minors
from .kmod import running_kernel
from .layout import Layout
from .state import State, load_state

log = logging.getLogger(__name__)

ALL_CHECKS = ("state", "gpu", "module", "kmod", "devices", "ldcache", "cuda", "support", "hooks")
LIBRARIES = ("libcuda.so.1", "libnvidia-ml.so.1")
PROC_VERSION_RE = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)")


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    message: str
    skipped: bool = False


@dataclass(frozen=True)
class DoctorReport:
    root: str
    active: str | None
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def problems(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "root": self.root,
            "active": self.active,
            "checks": [asdict(c) for c in self.checks],
        }

    def render(self) -> str:
        """One line per check; problems first-class (`FAIL name: message`)."""
        lines = []
        for c in self.checks:
            tag = "FAIL" if not c.ok else ("skip" if c.skipped else "ok")
            lines.append(f"{tag:4} {c.name}: {c.message}")
        return "\n".join(lines)


def gpus_present(root: Path) -> list[str]:
    """PCI addresses of NVIDIA display/3D controllers under ROOT/sys."""
    return [d.bus_id for d in nvidia_devices(root / "sys")
            if (cls := d.hex("class")) is not None and cls >> 16 == DISPLAY_CLASS]


def loaded_version(root: Path) -> str | None:
    """Version of the loaded nvidia kernel module, or None when it is not loaded."""
    problems: list[str] = []
    text = read_attr(root / "sys" / "module" / "nvidia" / "version", problems)
    if text is not None:
        return text.strip() or None
    proc = read_attr(root / "proc" / "driver" / "nvidia" / "version", problems, errors="replace")
    m = PROC_VERSION_RE.search(proc) if proc is not None else None
    for p in problems:
        log.warning("nvidia module version: %s", p)
    return m.group(1) if m else None


def _check_state(layout: Layout, state: State, expect_version: str | None = None) -> Check:
    if expect_version and state.active != expect_version:
        return Check("state", False, f"active driver is {state.active or 'none'}, expected {expect_version}")
    if not state.installed:
        return Check(
            "state", False, "no NVIDIA driver installed by nodeprep (nodeprep install --driver VERSION)"
        )
    if state.active is None:
        return Check(
            "state",
            False,
            f"installed: {', '.join(sorted(state.installed))}, none active (nodeprep activate VERSION)",
        )
    return Check("state", True, f"active {state.active}; installed: {', '.join(sorted(state.installed))}")


def _check_ldcache(layout: Layout, active: str | None) -> Check:
    if active is None:
        return Check("ldcache", False, "no active driver root for the ld cache to resolve into")
    try:
        entries = integration.read_ld_cache(layout)
    except CommandError as e:
        return Check("ldcache", False, f"cannot read {layout.node_path(layout.ld_cache)}: {e}")
    want = _real(layout, f"/opt/nvidia/{active}/lib64")
    bad, good = [], []
    for lib in LIBRARIES:
        paths = [p for name, flags, p in entries if name == lib and ("x86-64" in flags or "64" in flags)]
        paths = paths or [p for name, _f, p in entries if name == lib]
        if not paths:
            bad.append(
                f"{lib} is not in the ld cache (run ldconfig; is {layout.node_path(layout.ld_conf)} there?)"
            )
            continue
        first = paths[0]
        real = _real(layout, first)
        if real is None or want is None or real.parent != want or not real.is_file():
            bad.append(
                f"{lib} resolves to {first} -> {_node(layout, real) if real else 'a link loop'}, not into "
                f"/opt/nvidia/{active}/lib64"
            )
            continue
        extra = [p for p in paths[1:] if not p.startswith("/opt/nvidia/current/")
                 and _real(layout, p) != real]  # entry points lead there too
        good.append(
            f"{lib} -> {_node(layout, real)}" + (f" (also in cache: {', '.join(extra)})" if extra else "")
        )
    if bad:
        return Check("ldcache", False, "; ".join(bad))
    return Check("ldcache", True, "; ".join(good))


def _check_support(layout: Layout, active: str) -> Check:
    notes: list[str] = []
    problems = support.problems_for(layout.root, layout.version_dir(active), active, notes=notes)
    if problems is None:
        return Check("support", True, f"{active} carries no supported-GPU list: not checked", skipped=True)
    if problems:
        return Check("support", False, "; ".join(problems))
    gpus = support.node_pci_ids(layout.root)
    extra = f" ({'; '.join(notes)})" if notes else ""
    return Check("support", True, f"{active} supports the node's {len(gpus)} NVIDIA GPU(s){extra}")


def _real(layout: Layout, path: str) -> Path | None:
    """The file the node's `path` names, the image's links resolved beneath ROOT (never the host's
    files); None for a link loop or a file used as a directory."""
    try:
        return Path(os.path.realpath(layout.resolved(path)))
    except (InputError, ValueError):  # ValueError: a NUL in the cache's text
        return None


def _node(layout: Layout, path: Path) -> str:
    """The node's view of a resolved host path under ROOT."""
    try:
        return "/" + path.relative_to(layout.root.resolve()).as_posix()
    except ValueError:
        return str(path)


def doctor(
    root: Path, *, require_cuda: str | None = None, checks: set[str] | None = None,
    expect_version: str | None = None, inheriting_hooks: Callable[[Path], list[str]] | None = None,
) -> DoctorReport:
    """Check the node under `root`; `checks` limits which checks run (default: all); with
    `expect_version` the state check also fails unless that version is the active one;
    `inheriting_hooks(root)` lists the container hooks that would inherit a container's environment."""
    layout = Layout(Path(root))
    wanted = set(checks) if checks else set(ALL_CHECKS)
    unknown = wanted - set(ALL_CHECKS)
    if unknown:
        raise InputError(
            f"--check: unknown check(s) {', '.join(sorted(unknown))} (known: {', '.join(ALL_CHECKS)})"
        )
    if require_cuda is None:
        wanted.discard("cuda")
    else:
        cuda.validate_requirement(require_cuda)
        wanted.add("cuda")  # asking for a CUDA version always checks it
    if expect_version is not None:
        wanted.add("state")  # so does asking for a version
    state = load_state(layout.root)
    active = state.active
    out: list[Check] = []
    gpus = gpus_present(layout.root)
    loaded = loaded_version(layout.root)

    if "state" in wanted:
        out.append(_check_state(layout, state, expect_version))
    if "gpu" in wanted:
        out.append(
            Check("gpu", True, f"{len(gpus)} NVIDIA GPU(s): {', '.join(gpus)}")
            if gpus
            else Check("gpu", False, "no NVIDIA GPU on this node (no PCI device with vendor 10de)")
        )
    if "module" in wanted:
        if loaded is None:
            if gpus:
                out.append(
                    Check(
                        "module",
                        False,
                        "GPU present but the nvidia kernel module is not loaded "
                        "(systemctl start nodeprep-nvidia, or nodeprep load-modules)",
                    )
                )
            else:
                out.append(Check("module", True, "no driver loaded (no GPU)", skipped=True))
        elif active is None:
            out.append(Check("module", False, f"nvidia {loaded} is loaded but no user space is active"))
        elif loaded != active:
            out.append(
                Check(
                    "module",
                    False,
                    f"driver/library version mismatch: kernel module {loaded} is loaded, active user "
                    f"space is {active} (NVML: 'Failed to initialize NVML: Driver/library version "
                    f"mismatch'); fix: stop GPU workloads and systemctl restart nodeprep-nvidia "
                    f"(reloads {active}), or reboot, or nodeprep activate {loaded}",
                )
            )
        else:
            out.append(Check("module", True, f"kernel module {loaded} matches the active user space"))
    if "kmod" in wanted:
        if not layout.live or active is None:
            out.append(
                Check(
                    "kmod",
                    True,
                    "not checked (--root: the running kernel is not the image's)"
                    if not layout.live
                    else "not checked (nothing active)",
                    skipped=True,
                )
            )
        else:
            rel = running_kernel()
            kernels = state.installed[active].kernels
            out.append(
                Check(
                    "kmod",
                    rel in kernels,
                    f"{active} has modules for the running kernel {rel}"
                    if rel in kernels
                    else f"{active} has no modules for the running kernel {rel} (has: {', '.join(kernels)}); "
                    f"nodeprep install --driver {active}",
                )
            )
    if "devices" in wanted:
        if loaded is None:
            out.append(Check("devices", True, "not checked (driver not loaded)", skipped=True))
        else:
            minors = parse_gpu_minors(layout.root / "proc" / "driver" / "nvidia" / "gpus")
            need = [
                "/dev/nvidiactl",
                *(f"/dev/nvidia{n}" for n in minors),
                "/dev/nvidia-uvm",
                "/dev/nvidia-uvm-tools",
            ]
            missing = [d for d in need if not layout.host_path(d).exists()]
            out.append(
                Check(
                    "devices",
                    not missing,
                    f"missing {', '.join(missing)} (systemctl restart nodeprep-nvidia)"
                    if missing
                    else f"{len(need)} device nodes present",
                )
            )
    if "ldcache" in wanted:
        out.append(_check_ldcache(layout, active))
    if "support" in wanted and active is not None:
        out.append(_check_support(layout, active))
    if "cuda" in wanted and require_cuda is not None:
        if active is None:
            out.append(Check("cuda", False, f"CUDA {require_cuda} required but no driver is active"))
        else:
            ok, message = cuda.check_requirement(require_cuda, active)
            out.append(Check("cuda", ok, message))
    if "hooks" in wanted:
        out.append(_check_hook_audit(layout.root, inheriting_hooks))
    return DoctorReport(root=str(layout.root), active=active, checks=out)


def _check_hook_audit(root: Path, inheriting_hooks: Callable[[Path], list[str]] | None) -> Check:
    if inheriting_hooks is None:
        return Check("hooks", True, "not checked (this front-end has no container hook audit)", skipped=True)
    found = inheriting_hooks(root)
    if found:
        return Check("hooks", False, "container hooks a runtime starts with the container's environment "
                     "(an image's LD_PRELOAD runs in them as root; rewrite them with `nodeprep runtime`, "
                     "or NVIDIA's with nvidia-ctk >= 1.17.8): " + "; ".join(found))
    return Check("hooks", True, "every container hook on the node has an environment of its own")
