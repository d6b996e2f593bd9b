"""uninstall: back to the node before nodeprep: every file, link and folder nodeprep made, the
files it edited written back (its plan: `uninstall --check`)."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import runner
from ..atomicfile import atomic_write, fsync_dir
from ..crash import crash_point
from ..errors import InputError
from ..vocab import KERNEL_MODULES
from . import created, entrypoints, gpufacts, imagefile, integration, kernelhook
from .callbacks import ActivationCallbacks
from .driverplan import (
    UninstallPlan,
    plan_uninstall,
)
from .layout import (
    FABRICMANAGER_UNIT_NAME,
    MODULE_SUBDIR,
    PERSISTENCED_UNIT_NAME,
    TEMP_PREFIXES,
    UNIT_NAME,
    Layout,
)
from .leftovers import clean_leftovers, writes
from .lock import locked
from .state import State, load_state

log = logging.getLogger(__name__)


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
    mine = [*writes(layout, []), layout.state_file, layout.lock_file, layout.state_dir / created.CREATED,
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
    s.file(layout.ld_conf, lambda raw: raw == integration.LD_CONF.encode())
    s.file(layout.modprobe_conf, lambda raw: raw == integration.MODPROBE_CONF.encode())
    kernels = integration.linked_kernels(layout)
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
        for _, _, p in integration.read_ld_cache(layout))
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
            integration.run_ldconfig(layout)
            crash_point("uninstall:ldconfig")
        for rel in todo.depmod:
            if layout.resolved(f"/lib/modules/{rel}").is_dir():
                integration.depmod(layout, rel)
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
