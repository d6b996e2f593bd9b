"""install / activate / rollback / remove: the node-side driver lifecycle.

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

import functools
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import runner
from ..artifact import IndexEntry, Manifest, extract
from ..errors import InputError
from ..log import step
from ..modfacts import parse_vermagic
from ..profile.model import DEFAULT_DAEMONS, Daemons
from ..safetar import MANIFEST
from ..stores.oci import Options as StoreOptions
from ..stores.store import Store, cache_path
from ..sysfs import read_attr
from ..vocab import DEFAULT_MODULES, KERNEL_MODULES
from . import complete, created, entrypoints, gpufacts, imagefile, kernelhook, support, system
from .callbacks import ActivationCallbacks
from .crash import crash_point
from .devices import load_modules
from .fsutil import atomic_symlink, atomic_write, clean_temporaries, fsync_dir, fsync_tree
from .kmod import (
    check_modules,
    kernel_vermagic,
    running_kernel,
    target_kernel,
    vermagic_problem,
)
from .layout import (
    FABRICMANAGER_UNIT_NAME,
    MODULE_SUBDIR,
    PERSISTENCED_UNIT_NAME,
    TEMP_PREFIXES,
    UNIT_NAME,
    Layout,
    check_version,
)
from .lock import locked
from .plan import (
    InstallPlan,
    InstallRequest,
    UninstallPlan,
    daemon_commands,
    dropped_daemon_commands,
    needs_index,
    plan_activate,
    plan_install,
    plan_remove,
    plan_uninstall,
    rollback_target,
)
from .state import State, load_state, now, save_state

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InstallResult:
    version: str
    kernel: str
    changed: bool
    installed_userspace: bool = False
    installed_kmod: bool = False
    activation: ActivateResult | None = None
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "kernel": self.kernel,
            "changed": self.changed,
            "installed_userspace": self.installed_userspace,
            "installed_kmod": self.installed_kmod,
            "activation": self.activation.to_dict() if self.activation else None,
            "notes": list(self.notes),
        }


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


@dataclass(frozen=True)
class RemoveResult:
    version: str
    changed: bool
    removed: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "changed": self.changed, "removed": list(self.removed)}


# ---------------------------------------------------------------------------------------------


def clean_leftovers(layout: Layout) -> list[Path]:
    """Remove what an interrupted run left behind (only names nodeprep creates)."""
    removed = clean_temporaries(layout.opt, TEMP_PREFIXES)
    if layout.opt.is_dir():
        for vdir in layout.opt.iterdir():
            if not vdir.name.startswith(".") and (vdir / "modules").is_dir():
                removed += clean_temporaries(vdir / "modules", TEMP_PREFIXES)
    owned = (
        layout.ld_conf,
        layout.modprobe_conf,
        layout.unit,
        layout.unit_wants,
        layout.persistenced_unit,
        layout.persistenced_wants,
        layout.fabricmanager_unit,
        layout.fabricmanager_wants,
        layout.state_file,
        layout.current,
    )
    for path in owned:
        if path.parent.is_dir():
            removed += clean_temporaries(path.parent, (f".tmp-{path.name}.", f".current-{path.name}."))
    base = layout.resolved("/lib/modules")
    for rel in system.linked_kernels(layout):
        removed += clean_temporaries(base / rel / "updates" / "nodeprep", (".current-",))
    fw = layout.resolved("/lib/firmware/nvidia")
    if fw.is_dir():
        removed += clean_temporaries(fw, (".current-",))
    for p in removed:
        log.info("removed leftover of an interrupted run: %s", layout.node_path(p))
    return removed


def _stage_kmod(layout: Layout, kmod_path: Path, kernel: str, dest: Path) -> Manifest:
    """Unpack the kmod artifact into `dest` (= <staging>/modules/<rel>) after checking each .ko's
    vermagic against the target kernel."""
    tmp = dest.parent / f".staging-kmod-{kernel}-{os.getpid()}"
    tmp.mkdir(parents=True)
    try:
        manifest = extract(kmod_path, tmp)
        if manifest.kind != "kmod" or manifest.kernel_release != kernel:
            raise InputError(
                f"{kmod_path.name}: manifest says kind {manifest.kind}, kernel "
                f"{manifest.kernel_release}; expected a kmod for {kernel}"
            )
        if manifest.vermagic:
            problem = vermagic_problem(parse_vermagic(manifest.vermagic), kernel)
            if problem:
                raise InputError(f"{kmod_path.name}: {problem}")
        src = tmp / "modules" / kernel
        if not src.is_dir():
            raise InputError(f"{kmod_path.name}: no modules/{kernel}/ in the artifact")
        versions = check_modules(src, kernel, kernel_vermagic(layout, kernel))
        if versions.get("nvidia") not in (None, manifest.driver_version):
            raise InputError(
                f"{kmod_path.name}: nvidia.ko is version {versions['nvidia']}, "
                f"the artifact says {manifest.driver_version}"
            )
        crash_point("install:kmod-extracted")
        os.replace(tmp / MANIFEST, src / MANIFEST)
        os.rename(src, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def _request(layout: Layout, version: str, kernel: str | None, flavour: str | None, arch: str,
             activate: bool) -> InstallRequest:
    check_version(version)
    return InstallRequest(version=version, kernel=target_kernel(layout, kernel), flavour=flavour, arch=arch,
                          activate=activate)


def _live_kernel(layout: Layout) -> str | None:
    return running_kernel() if layout.live else None


def _plan_install(
    layout: Layout, index: Callable[[], list[IndexEntry]], request: InstallRequest, modules: tuple[str, ...],
    hook: kernelhook.HookConfig | None, daemons: Daemons = DEFAULT_DAEMONS,
) -> InstallPlan:
    """plan_install over this root's state, reading the store's index only when it is needed.
    `hook`: the kernel hook to set up (None: none)."""
    state = load_state(layout.root)
    entries = index() if needs_index(state, request.version, request.kernel) else None
    drift = (system.drift(layout, modules, daemons) + entrypoints.drift(layout, request.version, request.arch)
             if request.activate else ())
    hook_drift = kernelhook.drift(layout, system.nodeprep_command()) if hook else ()
    record = hook.to_dict() if hook else None
    if record and kernelhook.keep_record(state.active, state.kernel_hook, request.version, request.activate):
        record = state.kernel_hook  # the active version's modules come from the store recorded
    return plan_install(state, request, entries, live_kernel=_live_kernel(layout), drift=drift,
                        kernel_hook=record, hook_drift=hook_drift)


@dataclass(frozen=True)
class InstallInput:
    """What install() and plan_install_of() work from: the version chosen (node/usecase.py chooses
    it from the profile's driver section) and how to reach the store.
    `store_options`: registry credentials file, CA file, plain http (nodeprep/stores/oci.py), the
    files as this machine reads them; `kernel_hook`: record the store and write the kernel hooks
    (kernelhook.py) that install this driver's modules for kernels installed later; `keep_boot_kernel`
    is the hook's boot-default choice; `node_store`: the store the booted node reaches, recorded
    instead of `store` (kernelhook.node_store)."""

    store: str
    version: str
    kernel: str | None = None
    flavour: str | None = None
    arch: str = "amd64"
    activate: bool = False
    load: bool = True
    modules: tuple[str, ...] = DEFAULT_MODULES
    daemons: Daemons = DEFAULT_DAEMONS  # the driver's daemons whose units activation writes
    store_options: StoreOptions | None = None
    keep_boot_kernel: bool = False
    kernel_hook: bool = True
    node_store: str | None = None


def plan(root: Path, store: str, version: str, **given: Any) -> tuple[State, InstallPlan]:
    """plan_install_of() with InstallInput's fields as keywords (the library's plan tests)."""
    return plan_install_of(root, InstallInput(store, version, **given))


def plan_install_of(root: Path, given: InstallInput) -> tuple[State, InstallPlan]:
    """What install() with `given` would change (nothing written, no artifact fetched): the node's
    state now and the plan. `nodeprep install --check` and Ansible's check mode."""
    layout = Layout(Path(root))
    request = _request(layout, given.version, given.kernel, given.flavour, given.arch, given.activate)
    state = load_state(layout.root)
    src = Store(given.store, given.store_options or StoreOptions())
    hook = (_hook_config(layout, src.location, given.arch, given.store_options, given.keep_boot_kernel,
                         given.node_store) if given.kernel_hook else None)
    todo = _plan_install(layout, src.entries, request, given.modules, hook, given.daemons)
    return state, replace(todo, notes=todo.notes + _hook_notes(layout, src.location, given.node_store,
                                                                given.kernel_hook, hook))


def install(root: Path, given: InstallInput, *, callbacks: ActivationCallbacks) -> InstallResult:
    """Install user space + kmod of `given.version` from `given.store` into ROOT/opt/nvidia/<version>
    (and activate it when `given.activate`). `callbacks`: what follows an activation above the node
    (nodeprep.join.activation.CALLBACKS)."""
    store, version, kernel, flavour = given.store, given.version, given.kernel, given.flavour
    arch = given.arch
    activate, load, modules, store_options = given.activate, given.load, given.modules, given.store_options
    keep_boot_kernel, kernel_hook, node_store = given.keep_boot_kernel, given.kernel_hook, given.node_store
    layout = Layout(Path(root))
    request = _request(layout, version, kernel, flavour, arch, activate)
    rel = request.kernel
    src = Store(store, store_options or StoreOptions())
    # Planned before taking the lock (bad input fails fast, nothing changed), then again under it.
    index = functools.cache(src.entries)  # read at most once, and only when something is missing
    hook = (_hook_config(layout, src.location, arch, store_options, keep_boot_kernel, node_store)
            if kernel_hook else None)
    first = _plan_install(layout, index, request, modules, hook, given.daemons)
    if activate:  # another package's nvidia-smi: refused before anything is fetched or installed
        problem = entrypoints.refusal(layout, version, load_state(layout.root).entry_points,
                                      entrypoints.required(layout, arch))
        if problem:
            raise InputError(problem, hint="nothing was changed")
    if first.userspace is not None and first.kmod is not None and src.local is not None:
        _require_support(layout, src, first.userspace, first.kmod, version)  # the node's GPUs first
    with locked(layout):
        crash_point("install:locked")
        clean_leftovers(layout)
        todo = _plan_install(layout, index, request, modules, hook, given.daemons)
        if todo.new_version:
            assert todo.userspace is not None and todo.kmod is not None
            with step(f"Installing NVIDIA driver {version} for kernel {rel}"):
                _install_version(layout, src, todo.userspace, todo.kmod, version, rel)
        elif todo.kmod is not None:
            with step(f"Adding the kmod of {version} for kernel {rel}"):
                _add_kmod(layout, src, todo.kmod, version, rel)
        installed_us, installed_kmod = todo.new_version, todo.kmod is not None
        crash_point("install:unpacked")
        # the folders the rest makes (/opt/nvidia is nodeprep's own), noted before they are made
        created.note(layout, _writes(layout, [rel]))
        fw_link = system.link_firmware(layout, version)
        crash_point("install:firmware-linked")
        state = load_state(layout.root)
        entry = state.installed[version]
        state = replace(
            state,
            installed={
                **state.installed,
                version: replace(entry, firmware_link=fw_link, installed_at=entry.installed_at or now()),
            },
        )
        changed = installed_us or installed_kmod
        if todo.kernel_hook is not None:
            state = replace(state, kernel_hook=todo.kernel_hook.record)
            changed |= not todo.kernel_hook.recorded
        save_state(layout, state, point="install:state-tmp")
        crash_point("install:state-written")
        if todo.kernel_hook is not None and todo.kernel_hook.write:
            changed |= kernelhook.write_hooks(layout, system.nodeprep_command())
        activation = None
        if activate:
            activation = _activate(
                layout, version, kernel=rel if not layout.live else None, load=load, modules=modules,
                callbacks=callbacks, daemons=given.daemons,
            )
            changed = changed or activation.changed
        elif installed_kmod and version == state.active:
            system.link_modules(layout, version, [rel])
            system.depmod(layout, rel)
    return InstallResult(
        version=version,
        kernel=rel,
        changed=changed,
        installed_userspace=installed_us,
        installed_kmod=installed_kmod,
        activation=activation,
        notes=todo.notes + tuple(n for n in _hook_notes(layout, src.location, node_store, kernel_hook, hook)
                                 if activation is None or n not in activation.notes),
    )


def _hook_config(layout: Layout, store: str, arch: str, options: StoreOptions | None,
                 keep_boot_kernel: bool, node_store: str | None = None) -> kernelhook.HookConfig | None:
    """What the kernel hook needs, as the node sees it (paths under --root lose the prefix); None
    when the booted node would not reach the store (kernelhook.node_store)."""
    opts = options or StoreOptions()
    recorded = kernelhook.node_store(layout, store, node_store)
    if recorded is None:
        return None
    return kernelhook.HookConfig(
        store=recorded, arch=arch,
        registry_auth=kernelhook.node_view(layout, opts.registry_auth),
        ca_file=kernelhook.node_view(layout, opts.ca_file), insecure_http=opts.insecure_http,
        keep_boot_kernel=keep_boot_kernel)


def _hook_notes(layout: Layout, store: str, node_store: str | None, wanted: bool,
                hook: kernelhook.HookConfig | None) -> tuple[str, ...]:
    """What the install says about the kernel hook: not set up (an image's store), or the root
    lacking the nodeprep it runs (system.command_problem)."""
    if not wanted:
        return ()
    if hook is None:
        return (kernelhook.unrecorded_note(store),)
    note = system.command_problem(layout)
    return (f"warning: {note}",) if note else ()


def _require_support(layout: Layout, src: Store, us: IndexEntry, kmod: IndexEntry, version: str) -> None:
    """nodeprep.node.support against the user-space artifact's list. A local store's artifact is
    read where it is, before the lock; a remote one is downloaded under the lock (concurrent runs
    share the download directory) and dropped again when refused."""
    try:
        support.require_artifact(layout.root, src.fetch(us, layout.download_dir), version, kmod.flavour)
    except InputError:
        _drop_downloads(layout, src, us)
        raise


def _writes(layout: Layout, kernels: Sequence[str]) -> list[Path]:
    """Host paths an install or activation may write for `kernels` (not the entry points): what
    created.note looks above for folders it makes."""
    return [layout.opt / "current", layout.ld_conf, layout.modprobe_conf, layout.unit, layout.unit_wants,
            layout.persistenced_unit, layout.persistenced_wants, layout.fabricmanager_unit,
            layout.fabricmanager_wants,
            *(layout.module_links(rel) / "nvidia.ko" for rel in kernels),
            layout.resolved("/lib/firmware/nvidia") / "x", gpufacts.path(layout), layout.download_dir / "x",
            *(kernelhook.hook_path(layout, e) for e in kernelhook.EVENTS),
            layout.host_path(kernelhook.HOLD_FILE)]


def _install_version(
    layout: Layout, src: Store, us_entry: IndexEntry, kmod_entry: IndexEntry, version: str, kernel: str
) -> None:
    if src.local is None:
        _require_support(layout, src, us_entry, kmod_entry, version)
    layout.opt.mkdir(parents=True, exist_ok=True)
    us_path = src.fetch(us_entry, layout.download_dir)
    kmod_path = src.fetch(kmod_entry, layout.download_dir)
    crash_point("install:fetched")
    staging = layout.opt / f".staging-{version}-{os.getpid()}"
    staging.mkdir()
    try:
        manifest = extract(us_path, staging)
        if manifest.kind != "userspace" or manifest.driver_version != version:
            raise InputError(
                f"{us_entry.name}: manifest says {manifest.kind} {manifest.driver_version}, "
                f"expected userspace {version}"
            )
        crash_point("install:userspace-extracted")
        (staging / "modules").mkdir(exist_ok=True)
        _stage_kmod(layout, kmod_path, kernel, staging / "modules" / kernel)
        crash_point("install:kmod-staged")
        if (staging / "lib64").is_dir():
            system.soname_links(staging / "lib64")
        complete.check(layout, staging, version, action="install")
        fsync_tree(staging)
        crash_point("install:ldconfig-n")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    os.rename(staging, layout.version_dir(version))
    fsync_dir(layout.opt)
    crash_point("install:renamed")
    _drop_downloads(layout, src, us_entry, kmod_entry)


def _add_kmod(layout: Layout, src: Store, kmod_entry: IndexEntry, version: str, kernel: str) -> None:
    kmod_path = src.fetch(kmod_entry, layout.download_dir)
    mods = layout.version_dir(version) / "modules"
    mods.mkdir(exist_ok=True)
    tmpdest = mods / f".staging-dest-{kernel}-{os.getpid()}"
    try:
        _stage_kmod(layout, kmod_path, kernel, tmpdest)
    except BaseException:
        shutil.rmtree(tmpdest, ignore_errors=True)
        raise
    fsync_tree(tmpdest)
    crash_point("install:kmod-staged")
    os.rename(tmpdest, mods / kernel)
    fsync_dir(mods)
    crash_point("install:kmod-renamed")
    _drop_downloads(layout, src, kmod_entry)


def _drop_downloads(layout: Layout, src: Store, *entries: IndexEntry) -> None:
    if src.local is None:
        for e in entries:
            cache_path(layout.download_dir, e).unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------


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
        return _activate(layout, version, kernel=kernel, load=load, modules=modules, callbacks=callbacks,
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
        return _activate(layout, version, kernel=None, load=load, modules=modules, callbacks=callbacks,
                         daemons=daemons)


def _activate(
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
    created.note(layout, [*_writes(layout, list(target.kernels)), *map(layout.host_path, entry_points)],
                 caches=True)  # what this activation makes (folders, the ld caches), before it does
    previous = todo.active
    changed = False
    changed |= system.write_ld_conf(layout)
    crash_point("activate:ld-conf")
    changed |= system.write_modprobe_conf(layout)
    crash_point("activate:modprobe-conf")
    changed |= system.write_unit(layout, modules)
    persistenced_unit = system.write_persistenced_unit(layout, daemons.persistenced)
    fabricmanager_unit = system.write_fabricmanager_unit(layout, daemons.fabricmanager)
    changed |= persistenced_unit or fabricmanager_unit
    if problem := system.command_problem(layout):  # the unit runs the root's own nodeprep
        notes.append(f"warning: {problem}")
    old_kernels = set(system.linked_kernels(layout))
    changed |= system.link_modules(layout, version, list(target.kernels))
    stale = sorted(old_kernels - set(target.kernels))
    changed |= system.unlink_modules(layout, stale)
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
    system.run_ldconfig(layout)
    crash_point("activate:ldconfig")
    for rel in sorted(set(target.kernels) | set(stale)):
        system.depmod(layout, rel)
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
    for unit, unit_changed, wanted in (
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


# ---------------------------------------------------------------------------------------------


def remove(root: Path, version: str) -> RemoveResult:
    """Delete an installed, inactive version (only what nodeprep installed for it)."""
    layout = Layout(Path(root))
    check_version(version)
    with locked(layout):
        clean_leftovers(layout)
        state = load_state(layout.root)
        if not plan_remove(state, version).remove:
            return RemoveResult(version=version, changed=False)
        entry = state.installed[version]
        removed: list[str] = []
        if system.unlink_firmware(layout, version, entry.firmware_link):
            removed.append(str(entry.firmware_link))
        installed = {v: i for v, i in state.installed.items() if v != version}
        if state.active is None and state.entry_points:  # nothing active: no entry point has a target
            removed += entrypoints.unlink(layout, state.entry_points)
            state = replace(state, entry_points=())
        save_state(
            layout,
            replace(
                state, installed=installed, previous=None if state.previous == version else state.previous
            ),
        )
        vdir = layout.version_dir(version)
        doomed = layout.opt / f".removing-{version}-{os.getpid()}"
        os.rename(vdir, doomed)
        fsync_dir(layout.opt)
        crash_point("remove:renamed")
        shutil.rmtree(doomed)
        removed.append(layout.node_path(vdir))
    return RemoveResult(version=version, changed=True, removed=tuple(removed))


def list_versions(root: Path) -> State:
    return load_state(Path(root))


# ---------------------------------------------------------------------------------------------
# uninstall: back to the node before nodeprep

# Folders an uninstall never removes, even when it leaves them empty: the distribution's. Any other
# folder above a removed path goes too once it is empty, unless a dpkg package lists it.
_DISTRO_DIRS = frozenset({
    "/", "/etc", "/usr", "/usr/bin", "/usr/lib", "/usr/lib64", "/lib", "/lib64", "/bin", "/opt", "/var",
    "/var/lib", "/var/cache", "/var/log", "/run", "/var/run", "/lib/firmware", "/usr/lib/firmware",
    "/etc/ld.so.conf.d", "/etc/modprobe.d", "/etc/systemd", "/etc/systemd/system",
    "/etc/systemd/system/multi-user.target.wants", "/etc/kernel", "/etc/kernel/postinst.d",
    "/etc/kernel/postrm.d", "/etc/default", "/etc/default/grub.d",
    *(f"/usr/lib/{t}" for t in entrypoints.TRIPLETS.values()),
})
_MODULES_DIR = re.compile(r"(/usr)?/lib/modules(/[^/]+)?")
_SCRIPT_HEADER = b"#!/bin/sh\n# Written by nodeprep"
_HEADER = b"# Written by nodeprep"


@dataclass(frozen=True)
class UninstallResult:
    changed: bool
    removed: tuple[str, ...] = ()
    restored: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"changed": self.changed, "removed": list(self.removed), "restored": list(self.restored),
                "kept": list(self.kept), "notes": list(self.notes)}


class _Survey:
    """Collects what uninstall removes (node paths, in order) and what it leaves (lines)."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.remove: list[str] = []
        self.kept: list[str] = []

    def node(self, path: Path) -> str:
        return self.layout.node_path(path)

    def file(self, path: Path, ours: Callable[[bytes], bool]) -> None:
        """A file nodeprep writes: removed when `ours(content)`, else named and left."""
        if path.is_symlink() or path.is_file():
            try:
                mine = not path.is_symlink() and ours(path.read_bytes())
            except OSError:
                mine = False
            if mine:
                self.remove.append(self.node(path))
            else:
                self.kept.append(f"{self.node(path)}: not written by nodeprep; left in place")
        elif path.exists():
            self.kept.append(f"{self.node(path)}: not written by nodeprep; left in place")

    def link(self, path: Path, ours: Callable[[str], bool], *, name_foreign: bool = True) -> None:
        """A symlink nodeprep makes: removed when `ours(its text)`, else (optionally) named and left."""
        if path.is_symlink() and ours(os.readlink(path)):
            self.remove.append(self.node(path))
        elif name_foreign and os.path.lexists(path):
            self.kept.append(f"{self.node(path)}: not made by nodeprep; left in place")


def _entry_point_paths(state: State) -> list[str]:
    libdirs = ["/usr/lib64", *(f"/usr/lib/{t}" for t in entrypoints.TRIPLETS.values())]
    return sorted(set(state.entry_points) | {f"/usr/bin/{t}" for t in entrypoints.TOOLS}
                  | {f"{d}/{lib}" for d in libdirs for lib in entrypoints.LIBRARIES})


def _loaded_modules() -> tuple[str, ...]:
    """The nvidia modules loaded now, in the order to unload them."""
    return tuple(m for m in reversed(KERNEL_MODULES) if Path("/sys/module", m.replace("-", "_")).exists())


def _stale_module_index(layout: Layout) -> list[str]:
    """Kernels whose modules.dep still names nodeprep's module links (depmod to run again); each
    modules.dep read only as a regular file (imagefile.read)."""
    base = layout.resolved("/lib/modules")
    stale = []
    for kdir in sorted(base.iterdir()) if base.is_dir() else ():
        if kdir.is_symlink() or not kdir.is_dir():
            continue
        raw = imagefile.read(kdir / "modules.dep", limit=imagefile.MAX_LIST, what="depmod's module index")
        if raw is not None and f"{MODULE_SUBDIR}/".encode() in raw:
            stale.append(kdir.name)
    return stale


def _journal(layout: Layout) -> Path:
    """Where an uninstall notes the folders it removes once empty: a run killed after emptying a
    folder leaves it to the next run, which finds nothing of nodeprep's left inside it."""
    return layout.state_dir / created.JOURNAL


def _own_paths(layout: Layout, state: State, above: Sequence[str]) -> set[str]:
    """Node paths nodeprep writes on this root (its own and `above`, join's): a folder named in a
    record is trusted only above one of them (created.ours)."""
    mine = [*_writes(layout, []), layout.state_file, layout.lock_file, layout.state_dir / created.CREATED,
            _journal(layout)]
    return {layout.node_path(p) for p in mine} | set(_entry_point_paths(state)) | set(above)


def empty_folders(layout: Layout, removed: Sequence[str], candidates: Sequence[str] = (),
                  recorded: Sequence[str] = ()) -> list[str]:
    """Folders above `removed` (node paths; and the `candidates`) that hold nothing else once those
    are gone, deepest first; never the distribution's (unless `recorded`: nodeprep made it, created.py),
    nor one a dpkg package lists. Uninstall's rule (removal_folders: for the Ansible runtime and join
    modules' state=absent)."""
    gone = set(removed)
    made = set(recorded)
    out: list[str] = []
    grown = True
    while grown:
        grown = False
        folders = {os.path.dirname(p) for p in gone} | set(candidates)
        for folder in sorted(folders - gone, key=lambda p: -p.count("/")):
            if folder not in made and (folder in _DISTRO_DIRS or _MODULES_DIR.fullmatch(folder)):
                continue
            try:
                host = layout.host_path(folder)
            except InputError:
                continue
            if host.is_symlink() or not host.is_dir():
                continue
            held = {f"{folder}/{c}" for c in os.listdir(host)}
            if held <= gone and not entrypoints.dpkg_owner(layout, folder):
                gone.add(folder)
                out.append(folder)
                grown = True
    return out


def _empty_folders(layout: Layout, removed: list[str], candidates: list[str],
                   recorded: Sequence[str] = ()) -> list[str]:
    """empty_folders with uninstall's journal gone too, nodeprep's state folder last."""
    out = empty_folders(layout, [*removed, layout.node_path(_journal(layout))], candidates, recorded)
    state_dir = layout.node_path(layout.state_dir)
    return sorted(out, key=lambda f: f == state_dir)  # stable: deepest first, the journal's folder last


def removal_folders(layout: Layout, removed: Sequence[str], own: Sequence[str] = ()) -> list[str]:
    """The folders an undo of `removed` (node paths) leaves empty, with those a killed run noted
    (only those above `own`, the paths the caller writes: created.trusted): uninstall's (its journal
    gone too, the state folder last), for the Ansible runtime and join modules' state=absent
    (nodeprep.join.removal)."""
    journal, kept = created.trusted(layout, created.JOURNAL, [*own, *removed])
    for line in kept:
        log.warning("warning: %s", line)
    return _empty_folders(layout, list(removed), list(journal.folders), journal.folders)


def journal_folders(layout: Layout, folders: Sequence[str]) -> None:
    """Note `folders` before anything goes, where nodeprep's state folder is (none is made for it);
    no folders: the note is dropped."""
    if folders and layout.state_dir.is_dir():
        atomic_write(_journal(layout), json.dumps({"folders": list(folders)}) + "\n")
    elif not folders:
        _journal(layout).unlink(missing_ok=True)


def remove_empty_folder(layout: Layout, folder: str) -> None:
    """Remove one of removal_folders' folders (node path); the state folder after its journal."""
    path = layout.host_path(folder)
    if path == layout.state_dir:
        _journal(layout).unlink(missing_ok=True)
    path.rmdir()
    fsync_dir(path.parent)


def _made_kernel_dirs(layout: Layout, made: Sequence[str], remove: Sequence[str],
                      folders: Sequence[str]) -> tuple[list[str], list[str]]:
    """Of the folders nodeprep made, the /lib/modules/<rel> ones that hold nothing but depmod's
    outputs once `remove` and `folders` are gone (a kernel the root does not have: nodeprep's depmod
    made them): those outputs (node paths) and the kernels not to run depmod for again."""
    files: list[str] = []
    kernels: list[str] = []
    gone = set(remove) | set(folders)
    for kdir in made:
        host = layout.host_path(kdir)
        if not created.KERNEL_DIR.fullmatch(kdir) or host.is_symlink() or not host.is_dir():
            continue
        names = os.listdir(host)
        if all(n in created.DEPMOD_OUTPUTS or f"{kdir}/{n}" in gone for n in names):
            files += [f"{kdir}/{n}" for n in sorted(names) if n in created.DEPMOD_OUTPUTS]
            kernels.append(host.name)
    return files, kernels


def _survey(
    layout: Layout, callbacks: ActivationCallbacks
) -> tuple[UninstallPlan, dict[str, bytes], list[str]]:
    """The uninstall of this root (see uninstall()), the bytes of each file to write back and the
    folders it removes."""
    state = load_state(layout.root)
    above = callbacks.removal(layout.root)
    restore = {u.target: u.content for u in above.undo if u.content is not None}
    s = _Survey(layout)
    s.remove += [u.target for u in above.undo if u.content is None]
    s.kept += above.kept
    recorded = set(state.entry_points)
    for node_path in _entry_point_paths(state):
        try:
            path = layout.host_path(node_path)
        except InputError:
            continue
        s.link(path, lambda text: "/current/" in text, name_foreign=node_path in recorded)
    for event in kernelhook.EVENTS:
        s.file(kernelhook.hook_path(layout, event), lambda raw: raw.startswith(_SCRIPT_HEADER))
    s.file(layout.host_path(kernelhook.HOLD_FILE), lambda raw: raw.startswith(_HEADER))
    s.link(layout.unit_wants, lambda text: text == f"../{UNIT_NAME}")
    s.file(layout.unit, lambda raw: raw.startswith(_HEADER))
    s.link(layout.persistenced_wants, lambda text: text == f"../{PERSISTENCED_UNIT_NAME}")
    s.file(layout.persistenced_unit, lambda raw: raw.startswith(_HEADER))
    s.link(layout.fabricmanager_wants, lambda text: text == f"../{FABRICMANAGER_UNIT_NAME}")
    s.file(layout.fabricmanager_unit, lambda raw: raw.startswith(_HEADER))
    s.file(layout.ld_conf, lambda raw: raw == system.LD_CONF.encode())
    s.file(layout.modprobe_conf, lambda raw: raw == system.MODPROBE_CONF.encode())
    kernels = system.linked_kernels(layout)
    for rel in kernels:
        for child in sorted(layout.module_links(rel).iterdir()):
            s.link(child, lambda text: "/current/modules/" in text)
    firmware = layout.resolved("/lib/firmware/nvidia")
    for child in sorted(firmware.iterdir()) if firmware.is_dir() else ():
        s.link(child, lambda text: re.search(r"opt/nvidia/[^/]+/firmware/", text) is not None,
               name_foreign=False)
    if layout.opt.is_dir():
        s.link(layout.current, lambda text: True)
        s.file(gpufacts.path(layout), gpufacts.is_ours)
        for child in sorted(layout.opt.iterdir()):
            if child.name == "current" or child == gpufacts.path(layout):
                continue
            ours = child.name in state.installed and not child.is_symlink()
            if ours or child.name.startswith(TEMP_PREFIXES):
                s.remove.append(s.node(child))
            else:
                s.kept.append(f"{s.node(child)}: not installed by nodeprep; left in place")
    # mig.json: `nodeprep mig`'s record (the GPUs' MIG layout itself is left as it is)
    for path in (layout.download_dir, layout.state_file, layout.lock_file, layout.state_dir / "mig.json"):
        if path.exists() and not path.is_symlink():
            s.remove.append(s.node(path))
    # what nodeprep recorded making (created.json) and a killed run's folders (uninstall.json),
    # each entry trusted only for what nodeprep makes
    own = _own_paths(layout, state, above.paths)
    made, not_made = created.trusted(layout, created.CREATED, own)
    journal, not_journalled = created.trusted(layout, created.JOURNAL, own)
    s.kept += not_made + not_journalled
    record = layout.state_dir / created.CREATED
    after = [c for c in made.files if os.path.lexists(layout.host_path(c))]
    after += [s.node(record)] if os.path.lexists(record) else []
    recorded_folders = [*made.folders, *journal.folders]
    folders = _empty_folders(layout, [*s.remove, *after], recorded_folders, recorded_folders)
    outputs, fresh = _made_kernel_dirs(layout, made.folders, s.remove, folders)
    if outputs:
        s.remove += outputs
        folders = _empty_folders(layout, [*s.remove, *after], recorded_folders, recorded_folders)
    remove = s.remove + folders
    entry_points = set(_entry_point_paths(state))
    opt = s.node(layout.opt)
    ldconfig = bool({s.node(layout.ld_conf), opt} & set(remove)) or any(
        p.startswith(f"{opt}/current/")  # what a killed run left in the cache: nodeprep's names
        or (p in entry_points and (p in remove or not os.path.lexists(layout.host_path(p))))
        for _, _, p in system.read_ld_cache(layout))
    depmod = sorted((set(kernels) | set(_stale_module_index(layout))) - set(fresh))
    todo = plan_uninstall(
        remove, sorted(restore), s.kept, loaded=_loaded_modules() if layout.live else (),
        kernels=tuple(depmod), restart=above.restart, ldconfig=ldconfig, unit=s.node(layout.unit),
        # the daemon holds the GPUs open: stopped before the modules are unloaded
        stop=above.stop + tuple(name for name, path in ((FABRICMANAGER_UNIT_NAME, layout.fabricmanager_unit),
                                                        (PERSISTENCED_UNIT_NAME, layout.persistenced_unit))
                                if s.node(path) in remove),
        after=after, units=(s.node(layout.persistenced_unit), s.node(layout.fabricmanager_unit)))
    return todo, restore, folders


def plan_uninstall_of(root: Path, callbacks: ActivationCallbacks) -> UninstallPlan:
    """What uninstall() would do on `root` (nothing written, no lock taken): `uninstall --check`."""
    return _survey(Layout(Path(root)), callbacks)[0]


def uninstall(root: Path, *, callbacks: ActivationCallbacks) -> UninstallResult:
    """Return the node to what it was before nodeprep: every file, link and folder nodeprep made
    (recognised by content or by its record; any other file at such a path is left and named),
    files nodeprep edited written back, modules unloaded when nothing uses them (a live root), then
    ldconfig and depmod again (and a daemon-reload on a live root). On a live root the units join
    set up (kubelet) are stopped first, when active; under another root the running system is not
    touched. Refuses while another nodeprep
    run holds the lock. Each step is idempotent and recognised from the filesystem, so a run killed
    anywhere is finished by the next one. A root with nothing of nodeprep's is left as it is: nothing
    written, not even the lock. `callbacks`: join's part (nodeprep.join.activation.CALLBACKS)."""
    layout = Layout(Path(root))
    first = _survey(layout, callbacks)[0]
    if not (first.changes or first.ldconfig or first.depmod):
        return UninstallResult(changed=False, kept=first.kept)
    # the lock (and the folders) this run makes for itself are removed again, and are no change
    made = [d for d in (layout.state_dir, *layout.state_dir.parents) if d.is_relative_to(layout.root)
            and d != layout.root and not os.path.lexists(d)]
    own = {layout.node_path(layout.lock_file), *(layout.node_path(d) for d in made)} if made else set()
    with locked(layout, wait=False):
        crash_point("uninstall:locked")
        clean_leftovers(layout)
        todo, restore, folders = _survey(layout, callbacks)
        if folders:
            atomic_write(_journal(layout), json.dumps({"folders": folders}) + "\n")
        notes = stop_active(todo.stop)[1] if layout.live else []
        if todo.unload and runner.run(["modprobe", "-r", *todo.unload], check=False,
                                      timeout=120).returncode != 0:
            notes.append(f"{', '.join(todo.unload)}: in use, not unloaded; a reboot unloads them")
        for target, content in restore.items():
            path = layout.host_path(target)
            atomic_write(path, content, mode=path.stat().st_mode & 0o7777)
            crash_point(f"uninstall:restored {target}")
        for node_path in todo.remove:
            if node_path not in folders:  # those once ldconfig and depmod ran, and the records went
                _remove(layout, layout.host_path(node_path))
                crash_point(f"uninstall:removed {node_path}")
        if todo.ldconfig:
            system.run_ldconfig(layout)
            crash_point("uninstall:ldconfig")
        for rel in todo.depmod:
            if layout.resolved(f"/lib/modules/{rel}").is_dir():
                system.depmod(layout, rel)
        for node_path in (*todo.after, *folders):  # the caches ldconfig made, created.json, the folders
            _remove(layout, layout.host_path(node_path))
            crash_point(f"uninstall:removed {node_path}")
        if layout.live:
            for argv in todo.units_after():
                if runner.which("systemctl") is None:  # a root without systemd
                    notes.append(f"systemctl not found: `{' '.join(argv)}` skipped")
                else:
                    runner.run(argv, timeout=300, check=False)
    for folder in made[1:]:  # /var/lib, /var of an empty root (the state folder is planned)
        try:
            folder.rmdir()
        except OSError:
            break
    removed = tuple(p for p in (*todo.remove, *todo.after) if p not in own)
    return UninstallResult(changed=bool(removed or todo.restore or todo.unload), removed=removed,
                           restored=todo.restore, kept=todo.kept, notes=tuple(notes))


def stop_active(units: Sequence[str]) -> tuple[list[list[str]], list[str]]:
    """Stop each of `units` that systemd says is active (the running system; uninstall's first step
    where join set up the kubelet): the stop commands run, and a note for each unit not stopped
    because there is no systemctl."""
    ran: list[list[str]] = []
    notes: list[str] = []
    for unit in units:
        if runner.which("systemctl") is None:  # a root without systemd
            notes.append(f"systemctl not found: `systemctl stop {unit}` skipped")
        elif runner.run(["systemctl", "is-active", "--quiet", unit], timeout=60, check=False).returncode == 0:
            ran.append(["systemctl", "stop", unit])
            runner.run(ran[-1], timeout=300, check=False)
    return ran, notes


def _remove(layout: Layout, path: Path) -> None:
    """Delete one planned path: a version root by rename then delete (a kill leaves a .removing-
    leftover clean_leftovers finishes), the download cache whole, a folder only when empty."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.parent == layout.opt and path.is_dir():
        doomed = layout.opt / f".removing-{path.name}-{os.getpid()}"
        os.rename(path, doomed)
        fsync_dir(layout.opt)
        crash_point("uninstall:renamed")
        shutil.rmtree(doomed)
    elif path == layout.download_dir:
        shutil.rmtree(path, ignore_errors=True)
    elif path.is_dir():
        if path == layout.state_dir:
            _journal(layout).unlink(missing_ok=True)
        path.rmdir()
    if path.parent.is_dir():
        fsync_dir(path.parent)
