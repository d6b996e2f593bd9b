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

import logging
import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..artifact import MANIFEST, IndexEntry, Manifest, extract, find
from ..errors import InputError, StateError
from ..log import step
from ..stores.oci import Options as StoreOptions
from ..sysfs import read_attr
from . import complete, support, system
from .crash import crash_point
from .devices import load_modules
from .fsutil import atomic_symlink, clean_temporaries, fsync_dir, fsync_tree
from .kmod import (
    DEFAULT_LOAD,
    check_modules,
    kernel_vermagic,
    parse_vermagic,
    target_kernel,
    vermagic_problem,
)
from .layout import TEMP_PREFIXES, Layout, check_version
from .lock import locked
from .state import State, load_state, now, save_state, version_key
from .store import Store

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
        layout.state_file,
        layout.current,
    )
    for path in owned:
        if path.parent.is_dir():
            removed += clean_temporaries(path.parent, (f".tmp-{path.name}.", f".current-{path.name}."))
    base = layout.root / "lib" / "modules"
    for rel in system.linked_kernels(layout):
        removed += clean_temporaries(base / rel / "updates" / "nodeprep", (".current-",))
    fw = layout.root / "lib" / "firmware" / "nvidia"
    if fw.is_dir():
        removed += clean_temporaries(fw, (".current-",))
    for p in removed:
        log.info("removed leftover of an interrupted run: %s", layout.node_path(p))
    return removed


def _has_kernel(state: State, version: str, kernel: str) -> bool:
    have = state.installed.get(version)
    return have is not None and kernel in have.kernels


def _pick(
    src: Store, version: str, kernel: str, arch: str, flavour: str | None
) -> tuple[IndexEntry, IndexEntry]:
    """(user-space entry, kmod entry) of `version` for `kernel` from the store's index."""
    entries = src.entries()
    us_entry = find(entries, "userspace", version, arch=arch)
    if us_entry is None:
        have = sorted({e.driver_version for e in entries if e.kind == "userspace"}, key=version_key)
        raise InputError(
            f"--driver: no user-space artifact for {version} ({arch}) in the store "
            f"(available: {', '.join(have) or 'none'})"
        )
    return us_entry, _pick_kmod(entries, version, kernel, flavour)


def _pick_kmod(entries: list[IndexEntry], version: str, kernel: str, flavour: str | None) -> IndexEntry:
    kmods = [
        e
        for e in entries
        if e.kind == "kmod" and e.driver_version == version and (flavour is None or e.flavour == flavour)
    ]
    exact = [e for e in kmods if e.kernel_release == kernel]
    if not exact:
        if kmods:
            others = ", ".join(sorted({str(e.kernel_release) for e in kmods}))
            raise InputError(
                f"driver {version}: the store's kmod artifacts are built for kernel {others}, "
                f"the target kernel is {kernel} (vermagic mismatch); build one for {kernel}"
            )
        raise InputError(
            f"driver {version}: no kmod artifact in the store" + (f" (flavour {flavour})" if flavour else "")
        )
    if len(exact) > 1 and flavour is None:
        flavours = ", ".join(sorted(str(e.flavour) for e in exact))
        raise InputError(f"--flavour: driver {version} for {kernel} exists as {flavours}; pick one")
    entry = exact[0]
    if entry.vermagic:
        problem = vermagic_problem(parse_vermagic(entry.vermagic), kernel)
        if problem:
            raise InputError(f"{entry.name}: {problem}")
    return entry


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


def install(
    root: Path,
    store: str,
    version: str,
    *,
    kernel: str | None = None,
    flavour: str | None = None,
    arch: str = "amd64",
    activate: bool = False,
    load: bool = True,
    modules: tuple[str, ...] = DEFAULT_LOAD,
    store_options: StoreOptions | None = None,
) -> InstallResult:
    """Install user space + kmod of `version` from `store` into ROOT/opt/nvidia/<version>.
    `store_options`: registry credentials file, CA file, plain http (nodeprep/stores/oci.py)."""
    layout = Layout(Path(root))
    check_version(version)
    rel = target_kernel(layout, kernel)
    src = Store(store, store_options or StoreOptions())
    # The store is read before taking the lock (bad input fails fast, nothing changed), and only
    # when something is missing: a version installed for this kernel needs nothing from it, so a
    # re-run does not depend on the store being reachable (nor pay for asking it).
    picked = None if _has_kernel(load_state(layout.root), version, rel) else _pick(
        src, version, rel, arch, flavour)
    if picked is not None and src.local is not None:  # the node's GPUs against the driver's list,
        _require_support(layout, src, picked[0], picked[1], version)  # before anything changes
    notes: list[str] = []
    with locked(layout):
        crash_point("install:locked")
        clean_leftovers(layout)
        state = load_state(layout.root)
        have = state.installed.get(version)
        installed_us = installed_kmod = False
        if not _has_kernel(state, version, rel) and picked is None:  # removed since the first look
            picked = _pick(src, version, rel, arch, flavour)
        if have is None:
            assert picked is not None
            with step(f"Installing NVIDIA driver {version} for kernel {rel}"):
                _install_version(layout, src, picked[0], picked[1], version, rel)
            installed_us = installed_kmod = True
        else:
            if picked is not None and have.input_digest != picked[0].input_digest:
                notes.append(
                    f"{version} is installed from another build (input digest "
                    f"{have.input_digest[:12]}…, store has {picked[0].input_digest[:12]}…); "
                    f"remove it first to replace it"
                )
            if rel not in have.kernels:
                assert picked is not None
                with step(f"Adding the kmod of {version} for kernel {rel}"):
                    _add_kmod(layout, src, picked[1], version, rel)
                installed_kmod = True
            else:
                notes.append(f"{version} for kernel {rel} is already installed (the store was not read)")
        crash_point("install:unpacked")
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
        save_state(layout, state, point="install:state-tmp")
        crash_point("install:state-written")
        activation = None
        if activate:
            activation = _activate(
                layout, version, kernel=rel if not layout.live else None, load=load, modules=modules
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
        notes=tuple(notes),
    )


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
            system.ldconfig_links(staging / "lib64")
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
            (layout.download_dir / e.name).unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------


def activate(
    root: Path,
    version: str,
    *,
    kernel: str | None = None,
    load: bool = True,
    modules: tuple[str, ...] = DEFAULT_LOAD,
) -> ActivateResult:
    """Make installed `version` the active driver root (atomic switch of /opt/nvidia/current)."""
    layout = Layout(Path(root))
    check_version(version)
    with locked(layout):
        clean_leftovers(layout)
        return _activate(layout, version, kernel=kernel, load=load, modules=modules)


def rollback(root: Path, *, load: bool = True, modules: tuple[str, ...] = DEFAULT_LOAD) -> ActivateResult:
    """Activate the previously active version."""
    layout = Layout(Path(root))
    with locked(layout):
        clean_leftovers(layout)
        state = load_state(layout.root)
        if not state.previous:
            raise StateError(
                "nothing to roll back to: no previously active version is installed",
                hint=f"installed: {', '.join(sorted(state.installed)) or 'none'}",
            )
        return _activate(layout, state.previous, kernel=None, load=load, modules=modules)


def _activate(
    layout: Layout, version: str, *, kernel: str | None, load: bool, modules: tuple[str, ...]
) -> ActivateResult:
    crash_point("activate:start")
    state = load_state(layout.root)
    target = state.installed.get(version)
    if target is None:
        raise InputError(
            f"{version}: not installed (installed: "
            f"{', '.join(sorted(state.installed, key=version_key)) or 'none'})"
        )
    support.require(layout.root, layout.version_dir(version), version)  # the node's GPUs
    notes: list[str] = []
    if layout.live:
        rel = target_kernel(layout, kernel)
        if rel not in target.kernels:
            raise InputError(
                f"{version} has no kernel modules for the running kernel {rel} "
                f"(it has: {', '.join(target.kernels) or 'none'}); "
                f"nodeprep install --driver {version} adds them"
            )
    elif kernel and kernel not in target.kernels:
        raise InputError(
            f"{version} has no kernel modules for kernel {kernel} "
            f"(it has: {', '.join(target.kernels) or 'none'})"
        )
    complete.check(layout, layout.version_dir(version), version, action="activate")
    from ..join.cdi import refresh_problem  # join imports node: import at use

    spec_problem = refresh_problem(layout.root)
    if spec_problem:  # the spec must follow the switch: refuse before changing anything
        raise InputError(f"{spec_problem}; {version} not activated", hint="nothing was changed")
    previous = state.active
    changed = False
    changed |= system.write_ld_conf(layout)
    crash_point("activate:ld-conf")
    changed |= system.write_modprobe_conf(layout)
    crash_point("activate:modprobe-conf")
    changed |= system.write_unit(layout, modules)
    old_kernels = set(system.linked_kernels(layout))
    changed |= system.link_modules(layout, version, list(target.kernels))
    stale = sorted(old_kernels - set(target.kernels))
    changed |= system.unlink_modules(layout, stale)
    crash_point("activate:module-links")
    new_previous = previous if previous and previous != version else state.previous
    new_state = replace(state, active=version, previous=new_previous)
    changed |= save_state(layout, new_state, point="activate:state-tmp")
    crash_point("activate:state-written")
    flipped = atomic_symlink(layout.current, version, point="activate:link-created")
    changed |= flipped
    crash_point("activate:flipped")
    system.run_ldconfig(layout)
    crash_point("activate:ldconfig")
    for rel in sorted(set(target.kernels) | set(stale)):
        system.depmod(layout, rel)
    crash_point("activate:depmod")
    from ..join.cdi import refresh_after_activation  # join imports node: import at use

    for spec in refresh_after_activation(layout.root, version):
        changed = True
        notes.append(f"{spec} now mounts {version}")
    from ..join.containerd import drop_in_runtime_warning

    missing_runtime = drop_in_runtime_warning(layout.root)
    if missing_runtime:
        notes.append(missing_runtime)
    loaded = False
    if not load:
        notes.append("module loading skipped (--no-load)")
    elif not layout.live:
        notes.append(f"module loading skipped (--root {layout.root}): the unit loads them at boot")
    else:
        loaded = _reload(version, modules, notes)
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
        entry = state.installed.get(version)
        if entry is None:
            return RemoveResult(version=version, changed=False)
        if version == state.active:
            raise InputError(
                f"{version} is the active driver; activate another version first "
                f"(nodeprep activate VERSION or nodeprep rollback)"
            )
        removed: list[str] = []
        if system.unlink_firmware(layout, version, entry.firmware_link):
            removed.append(str(entry.firmware_link))
        installed = {v: i for v, i in state.installed.items() if v != version}
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
