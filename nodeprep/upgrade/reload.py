"""Reload or reboot: a new driver's modules replace the loaded ones in place only when nothing holds
them. `decide` is pure; `survey` reads the facts (module reference counts and holders under
SYSFS/module/<name>/, GPU processes: /dev/nvidia* open in PROC/<pid>/fd); `reload` unloads and loads.

The nvidia stack's own modules hold each other (nvidia_uvm, nvidia_modeset, nvidia_drm hold nvidia):
those references are subtracted. Any other reference (an open device, a module outside the stack such
as nvidia_fs holding nvidia) means reboot; so does a process that has a GPU device open.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import runner
from ..sysfs import read_attr
from ..vocab import KERNEL_MODULES

log = logging.getLogger(__name__)

NONE, LOAD, RELOAD, REBOOT = "none", "load", "reload", "reboot"
STACK = tuple(m.replace("-", "_") for m in KERNEL_MODULES)  # the names under /sys/module
MAX_PROCS = 65536


@dataclass(frozen=True)
class ModuleUse:
    name: str
    refcnt: int
    holders: tuple[str, ...]


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    comm: str
    device: str


@dataclass(frozen=True)
class Survey:
    loaded_version: str | None
    modules: tuple[ModuleUse, ...]
    processes: tuple[GpuProcess, ...]
    problems: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "loaded_version": self.loaded_version,
            "modules": [
                {"name": m.name, "refcnt": m.refcnt, "holders": list(m.holders)} for m in self.modules
            ],
            "processes": [{"pid": p.pid, "comm": p.comm, "device": p.device} for p in self.processes],
            "problems": list(self.problems),
        }


@dataclass(frozen=True)
class Decision:
    action: str
    reasons: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "reboot_required": self.action == REBOOT,
            "reasons": list(self.reasons),
        }


def decide(survey: Survey, target: str) -> Decision:
    """What replacing the loaded driver with `target` takes (pure)."""
    if survey.loaded_version is None:
        return Decision(LOAD, ("no nvidia module is loaded",))
    if survey.loaded_version == target:
        return Decision(NONE, (f"nvidia {target} is loaded already",))
    reasons = list(survey.problems)
    for m in survey.modules:
        outside = [h for h in m.holders if h not in STACK]
        inside = len(m.holders) - len(outside)
        if outside:
            reasons.append(f"module {m.name} is held by {', '.join(outside)}")
        if m.refcnt - inside > 0:
            reasons.append(
                f"module {m.name} is in use (reference count {m.refcnt}, "
                f"{inside} of them the nvidia stack's own modules)"
            )
    for p in survey.processes:
        reasons.append(f"process {p.pid} ({p.comm}) has {p.device} open")
    if reasons:
        return Decision(REBOOT, (f"nvidia {survey.loaded_version} is loaded and held", *reasons))
    return Decision(
        RELOAD, (f"nvidia {survey.loaded_version} is loaded and nothing holds it: unload, load {target}",)
    )


def _int(text: str | None) -> int | None:
    try:
        return int((text or "").strip())
    except ValueError:
        return None


def survey(sysfs_root: Path, proc_root: Path) -> Survey:
    """The loaded nvidia stack's reference counts and holders, and the processes with a GPU open."""
    problems: list[str] = []
    base = sysfs_root / "module"
    version = (read_attr(base / "nvidia" / "version", problems) or "").strip() or None
    mods = []
    for name in STACK:
        d = base / name
        if not d.is_dir():
            continue
        count = _int(read_attr(d / "refcnt", problems))
        if count is None:
            problems.append(f"{d / 'refcnt'}: no reference count (cannot tell whether it is in use)")
            count = 1
        try:
            holders = tuple(sorted(p.name for p in (d / "holders").iterdir()))
        except OSError:
            holders = ()
        mods.append(ModuleUse(name, count, holders))
    return Survey(version, tuple(mods), tuple(gpu_processes(proc_root)), tuple(problems))


def gpu_processes(proc_root: Path) -> list[GpuProcess]:
    """Processes with a /dev/nvidia* device open (their fd links under PROC/<pid>/fd)."""
    out: list[GpuProcess] = []
    try:
        pids = sorted(int(p.name) for p in proc_root.iterdir() if p.name.isdigit())[:MAX_PROCS]
    except OSError:
        return out
    for pid in pids:
        fd_dir = proc_root / str(pid) / "fd"
        try:
            fds = list(os.scandir(fd_dir))
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd.path)
            except OSError:
                continue
            if target.startswith("/dev/nvidia"):
                comm = (read_attr(proc_root / str(pid) / "comm", errors="replace") or "?").strip()
                out.append(GpuProcess(pid, comm, target))
                break
    return out


def unload_order(loaded: Sequence[str]) -> list[str]:
    """The loaded stack modules, holders before what they hold (nvidia last): KERNEL_MODULES is in
    load order, so its reverse unloads the GPUDirect modules and nvidia-drm before what they hold."""
    return [m for m in reversed(STACK) if m in loaded]


def reload(survey_: Survey, modules: tuple[str, ...], load: Any) -> list[str]:
    """Unload the stack (modprobe -r, holders first), then `load(modules)` (node.devices.load_modules);
    the lines of what was done."""
    names = unload_order([m.name for m in survey_.modules])
    for name in names:
        runner.run(["modprobe", "-r", name], timeout=120)
    made = load(modules)
    return [
        f"unloaded {', '.join(names) or 'nothing'}",
        f"loaded {', '.join(modules)}; created {', '.join(made) or 'no new device nodes'}",
    ]


def summary(decision: Decision, facts: Mapping[str, Any]) -> dict[str, Any]:
    return {**decision.to_dict(), "survey": dict(facts)}
