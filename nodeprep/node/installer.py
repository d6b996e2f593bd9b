"""install: a driver version from the store into its own root beside the others (user space and the
kmod for one kernel, staged and renamed into place complete), its plan (`install --check`), and with
`activate` the switch (switch.py). Crash safety: leftovers.py, switch.py."""

from __future__ import annotations

import functools
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..artifact import IndexEntry, Manifest, extract
from ..atomicfile import fsync_dir, fsync_tree
from ..crash import crash_point
from ..errors import InputError
from ..log import step
from ..modinfo import parse_vermagic
from ..profile.model import DEFAULT_DAEMONS, Daemons
from ..safetar import MANIFEST
from ..stores.oci import Options as StoreOptions
from ..stores.store import Store, cache_path
from ..vocab import DEFAULT_MODULES
from . import complete, created, entrypoints, integration, kernelhook, support
from .callbacks import ActivationCallbacks
from .driverplan import (
    InstallPlan,
    InstallRequest,
    needs_index,
    plan_install,
)
from .kmod import (
    check_modules,
    kernel_vermagic,
    running_kernel,
    target_kernel,
    vermagic_problem,
)
from .layout import (
    Layout,
    check_version,
)
from .leftovers import clean_leftovers, writes
from .lock import locked
from .state import State, load_state, now, save_state
from .switch import ActivateResult, switch

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
    kernel_hook_config: kernelhook.KernelHookConfig | None, daemons: Daemons = DEFAULT_DAEMONS,
) -> InstallPlan:
    """plan_install over this root's state, reading the store's index only when it is needed.
    `kernel_hook_config`: the kernel hook to set up (None: none)."""
    state = load_state(layout.root)
    entries = index() if needs_index(state, request.version, request.kernel) else None
    drift = (integration.drift(layout, modules, daemons)
             + entrypoints.drift(layout, request.version, request.arch)
             if request.activate else ())
    kernel_hook_drift = kernelhook.drift(layout, integration.nodeprep_command()) if kernel_hook_config else ()
    record = kernel_hook_config.to_dict() if kernel_hook_config else None
    if record and kernelhook.keep_record(state.active, state.kernel_hook, request.version, request.activate):
        record = state.kernel_hook  # the active version's modules come from the store recorded
    return plan_install(state, request, entries, live_kernel=_live_kernel(layout), drift=drift,
                        kernel_hook=record, kernel_hook_drift=kernel_hook_drift)


@dataclass(frozen=True)
class InstallInput:
    """What install() and plan_install_of() work from: the version chosen (node/driververbs.py chooses
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
    kernel_hook_config = (_kernel_hook_config(layout, src.location, given.arch, given.store_options,
                                              given.keep_boot_kernel, given.node_store)
                          if given.kernel_hook else None)
    todo = _plan_install(layout, src.entries, request, given.modules, kernel_hook_config, given.daemons)
    return state, replace(todo, notes=todo.notes + _kernel_hook_notes(layout, src.location, given.node_store,
                                                                       given.kernel_hook, kernel_hook_config))


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
    kernel_hook_config = (_kernel_hook_config(layout, src.location, arch, store_options, keep_boot_kernel,
                                              node_store)
                          if kernel_hook else None)
    first = _plan_install(layout, index, request, modules, kernel_hook_config, given.daemons)
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
        todo = _plan_install(layout, index, request, modules, kernel_hook_config, given.daemons)
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
        created.note(layout, writes(layout, [rel]))
        fw_link = integration.link_firmware(layout, version)
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
            changed |= kernelhook.write_hooks(layout, integration.nodeprep_command())
        activation = None
        if activate:
            activation = switch(
                layout, version, kernel=rel if not layout.live else None, load=load, modules=modules,
                callbacks=callbacks, daemons=given.daemons,
            )
            changed = changed or activation.changed
        elif installed_kmod and version == state.active:
            integration.link_modules(layout, version, [rel])
            integration.depmod(layout, rel)
    return InstallResult(
        version=version,
        kernel=rel,
        changed=changed,
        installed_userspace=installed_us,
        installed_kmod=installed_kmod,
        activation=activation,
        notes=todo.notes + tuple(n for n in _kernel_hook_notes(layout, src.location, node_store, kernel_hook,
                                                               kernel_hook_config)
                                 if activation is None or n not in activation.notes),
    )


def _kernel_hook_config(layout: Layout, store: str, arch: str, options: StoreOptions | None,
                        keep_boot_kernel: bool, node_store: str | None = None
                        ) -> kernelhook.KernelHookConfig | None:
    """What the kernel hook needs, as the node sees it (paths under --root lose the prefix); None
    when the booted node would not reach the store (kernelhook.node_store)."""
    opts = options or StoreOptions()
    recorded = kernelhook.node_store(layout, store, node_store)
    if recorded is None:
        return None
    return kernelhook.KernelHookConfig(
        store=recorded, arch=arch,
        registry_auth=kernelhook.node_view(layout, opts.registry_auth),
        ca_file=kernelhook.node_view(layout, opts.ca_file), insecure_http=opts.insecure_http,
        keep_boot_kernel=keep_boot_kernel)


def _kernel_hook_notes(layout: Layout, store: str, node_store: str | None, wanted: bool,
                       kernel_hook_config: kernelhook.KernelHookConfig | None) -> tuple[str, ...]:
    """What the install says about the kernel hook: not set up (an image's store), or the root
    lacking the nodeprep it runs (integration.command_problem)."""
    if not wanted:
        return ()
    if kernel_hook_config is None:
        return (kernelhook.unrecorded_note(store),)
    note = integration.command_problem(layout)
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
            integration.soname_links(staging / "lib64")
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
