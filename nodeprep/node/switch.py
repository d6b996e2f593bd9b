"""activate / rollback: the atomic switch of /opt/nvidia/current to an installed version, the
files that follow it, the modules reloaded.

Crash safety (kill -9 anywhere leaves the previously active version working):
- a version is unpacked into ROOT/opt/nvidia/.staging-<v>-<pid> and renamed into place complete;
  a kmod for one more kernel is staged the same way under <v>/modules/;
- `current` is switched by creating a new symlink and renaming it over the old one;
- ld.so.conf.d, modprobe.d, the unit and state.json are written to a temporary name and renamed;
- the ld cache names /opt/nvidia/current/lib64/..., so it follows the switch without a rebuild;
- module links name /opt/nvidia/current/modules/<rel>/..., so they follow it too;
- leftovers (.staging-*, .tmp-*, .current-*, .removing-*) are removed at the start of the next run.

A version is installed, and `current` switched to it, only when it is complete (complete.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import runner
from ..atomicfile import atomic_symlink
from ..crash import crash_point
from ..errors import InputError
from ..profile.model import DEFAULT_DAEMONS, Daemons
from ..sysfs import read_attr
from ..vocab import DEFAULT_MODULES
from . import complete, created, entrypoints, gpufacts, integration, support
from .callbacks import ActivationCallbacks
from .devices import load_modules
from .driverplan import daemon_commands, dropped_daemon_commands, plan_activate, rollback_target
from .kmod import (
    target_kernel,
)
from .layout import (
    FABRICMANAGER_UNIT_NAME,
    PERSISTENCED_UNIT_NAME,
    Layout,
    check_version,
)
from .leftovers import clean_leftovers, writes
from .lock import locked
from .state import load_state, save_state

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActivateResult:
    version: str
    previous: str | None
    changed: bool
    kernels: tuple[str, ...] = ()
    loaded: bool = False
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "previous": self.previous,
            "changed": self.changed,
            "kernels": list(self.kernels),
            "loaded": self.loaded,
            "notes": list(self.notes),
        }


def activate(
    root: Path,
    version: str,
    *,
    kernel: str | None = None,
    load: bool = True,
    modules: tuple[str, ...] = DEFAULT_MODULES,
    callbacks: ActivationCallbacks,
    daemons: Daemons = DEFAULT_DAEMONS,
) -> ActivateResult:
    """Make installed `version` the active driver root (atomic switch of /opt/nvidia/current).
    `callbacks`: what follows an activation above the node (nodeprep.join.activation.CALLBACKS)."""
    layout = Layout(Path(root))
    check_version(version)
    with locked(layout):
        clean_leftovers(layout)
        return switch(layout, version, kernel=kernel, load=load, modules=modules, callbacks=callbacks,
                      daemons=daemons)


def rollback(
    root: Path, *, load: bool = True, modules: tuple[str, ...] = DEFAULT_MODULES,
    callbacks: ActivationCallbacks, daemons: Daemons = DEFAULT_DAEMONS,
) -> ActivateResult:
    """Activate the previously active version."""
    layout = Layout(Path(root))
    with locked(layout):
        clean_leftovers(layout)
        version = rollback_target(load_state(layout.root))
        return switch(layout, version, kernel=None, load=load, modules=modules, callbacks=callbacks,
                      daemons=daemons)


def switch(
    layout: Layout, version: str, *, kernel: str | None, load: bool, modules: tuple[str, ...],
    callbacks: ActivationCallbacks, daemons: Daemons = DEFAULT_DAEMONS,
) -> ActivateResult:
    crash_point("activate:start")
    state = load_state(layout.root)
    live_kernel = target_kernel(layout, kernel) if layout.live else None
    todo = plan_activate(state, version, kernel=None if layout.live else kernel, live_kernel=live_kernel)
    target = state.installed[version]
    support.require(layout.root, layout.version_dir(version), version)  # the node's GPUs
    notes: list[str] = []
    complete.check(layout, layout.version_dir(version), version, action="activate")
    spec_problem = callbacks.refusal(layout.root)
    if spec_problem:  # the spec must follow the switch: refuse before changing anything
        raise InputError(f"{spec_problem}; {version} not activated", hint="nothing was changed")
    entry_problem = entrypoints.refusal(layout, version, state.entry_points)
    if entry_problem:  # another package's nvidia-smi, libnvidia-ml.so.1, ...: never replaced
        raise InputError(entry_problem, hint="nothing was changed")
    entry_points = tuple(sorted(entrypoints.planned(layout, version)))
    created.note(layout, [*writes(layout, list(target.kernels)), *map(layout.host_path, entry_points)],
                 caches=True)  # what this activation makes (folders, the ld caches), before it does
    previous = todo.active
    changed = False
    changed |= integration.write_ld_conf(layout)
    crash_point("activate:ld-conf")
    changed |= integration.write_modprobe_conf(layout)
    crash_point("activate:modprobe-conf")
    changed |= integration.write_unit(layout, modules)
    persistenced_unit = integration.write_persistenced_unit(layout, daemons.persistenced)
    fabricmanager_unit = integration.write_fabricmanager_unit(layout, daemons.fabricmanager)
    changed |= persistenced_unit or fabricmanager_unit
    if problem := integration.command_problem(layout):  # the unit runs the root's own nodeprep
        notes.append(f"warning: {problem}")
    old_kernels = set(integration.linked_kernels(layout))
    changed |= integration.link_modules(layout, version, list(target.kernels))
    stale = sorted(old_kernels - set(target.kernels))
    changed |= integration.unlink_modules(layout, stale)
    crash_point("activate:module-links")
    new_previous = previous if previous and previous != version else state.previous
    recorded = tuple(sorted(set(state.entry_points) | set(entry_points)))  # recorded before made
    new_state = replace(state, active=version, previous=new_previous, entry_points=recorded)
    changed |= save_state(layout, new_state, point="activate:state-tmp")
    crash_point("activate:state-written")
    flipped = atomic_symlink(layout.current, version, point="activate:link-created")
    changed |= flipped
    crash_point("activate:flipped")
    changed |= _follow_entry_points(layout, version, new_state.entry_points, entry_points)
    integration.run_ldconfig(layout)
    crash_point("activate:ldconfig")
    for rel in sorted(set(target.kernels) | set(stale)):
        integration.depmod(layout, rel)
    crash_point("activate:depmod")
    followed = callbacks.follow(layout.root, version)
    changed |= bool(followed.rewritten)
    notes.extend(followed.notes)
    loaded = False
    if not load:
        notes.append("module loading skipped (--no-load)")
    elif not layout.live:
        notes.append(f"module loading skipped (--root {layout.root}): the unit loads them at boot")
    else:
        loaded = _reload(version, modules, notes)
    for unit, unit_changed, wanted in (  # persistenced first
            (PERSISTENCED_UNIT_NAME, persistenced_unit, daemons.persistenced),
            (FABRICMANAGER_UNIT_NAME, fabricmanager_unit, daemons.fabricmanager != "never")):
        if wanted:
            _daemon(layout, unit, loaded=loaded, unit_changed=unit_changed, switched=flipped, notes=notes)
        elif unit_changed:  # the profile turned it off: the unit nodeprep wrote is gone, its daemon stops
            _systemctl(layout, unit, dropped_daemon_commands(unit, live=layout.live), notes)
    changed |= gpufacts.refresh(layout, notes)  # after the reload: NVML of the new driver
    crash_point("activate:gpu-facts")
    if flipped:
        log.info("active NVIDIA driver: %s (was %s)", version, previous or "none")
    else:
        notes.append(f"{version} is already active")
    return ActivateResult(
        version=version,
        previous=previous if flipped else state.previous,
        changed=changed,
        kernels=target.kernels,
        loaded=loaded,
        notes=tuple(notes),
    )


def _daemon(layout: Layout, unit: str, *, loaded: bool, unit_changed: bool, switched: bool,
            notes: list[str]) -> None:
    """Run a daemon unit's commands of this activation (a live root only)."""
    argvs = daemon_commands(unit, live=layout.live, loaded=loaded, unit_changed=unit_changed,
                            switched=switched)
    _systemctl(layout, unit, argvs, notes)


def _systemctl(layout: Layout, unit: str, argvs: list[list[str]], notes: list[str]) -> None:
    if argvs and runner.which("systemctl") is None:
        notes.append(f"systemctl not found: {unit} not started")
        return
    for argv in argvs:
        if runner.run(argv, timeout=360, check=False).returncode != 0:
            notes.append(f"`{' '.join(argv)}` failed (journalctl -u {unit})")


def _follow_entry_points(layout: Layout, version: str, recorded: tuple[str, ...],
                         entry_points: tuple[str, ...]) -> bool:
    """Make the entry points of the now active `version` (links through `current`) and drop the
    `recorded` ones it does not ship; True if anything changed."""
    changed = entrypoints.link(layout, version)
    stale = set(recorded) - set(entry_points)
    if stale:
        entrypoints.unlink(layout, stale)
        save_state(layout, replace(load_state(layout.root), entry_points=entry_points))
        changed = True
    return changed


def _reload(version: str, modules: tuple[str, ...], notes: list[str]) -> bool:
    problems: list[str] = []
    running = (read_attr(Path("/sys/module/nvidia/version"), problems) or "").strip()
    for p in problems:
        notes.append(f"loaded nvidia module version unreadable: {p}")
    if running:
        if running == version:
            notes.append(f"nvidia {running} already loaded")
            load_modules(modules)
            return True
        notes.append(
            f"nvidia {running} is loaded: unload it (stop GPU workloads, then "
            f"systemctl restart nodeprep-nvidia) or reboot to use {version}"
        )
        return False
    made = load_modules(modules)
    notes.append(f"loaded {', '.join(modules)}; created {', '.join(made) or 'no new device nodes'}")
    return True
