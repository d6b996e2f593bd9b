"""What nodeprep made on a root that is not a file it writes, recorded so `uninstall` takes exactly
that away again: the folders its writes created (a root without /usr/lib/firmware,
multi-user.target.wants, /usr/lib/modules/<kernel>, ...), noted *before* they are made, and the
ldconfig caches its first ldconfig created (/etc/ld.so.cache, /var/cache/ldconfig/aux-cache).
Recorded in /var/lib/nodeprep/created.json; uninstall's own journal (uninstall.json) has the same
form.

Both records are the image's bytes when read: a regular file only (imagefile.read), each field
checked (InputError naming the file and the field), and an entry is trusted only for what nodeprep
itself can make (`ours`): a folder above one of nodeprep's own paths (two components deep at
least), a file among CACHES. Anything else is left in place and named in one line."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ..atomicfile import atomic_write
from ..errors import InputError
from . import imagefile
from .layout import Layout

CREATED = "created.json"
JOURNAL = "uninstall.json"
CACHES = ("/etc/ld.so.cache", "/var/cache/ldconfig/aux-cache")  # what ldconfig -r makes
# the folders a module link's path can make: /lib/modules, /lib/modules/<rel>, .../updates/nodeprep
MODULE_TREE = re.compile(r"(/usr)?/lib/modules(/[^/]+(/updates(/nodeprep)?)?)?")
KERNEL_DIR = re.compile(r"(/usr)?/lib/modules/[^/]+")
# what `depmod` writes into /lib/modules/<rel> (kmod 30..34)
DEPMOD_OUTPUTS = frozenset(f"modules.{n}" for n in (
    "alias", "alias.bin", "builtin.alias.bin", "builtin.bin", "dep", "dep.bin", "devname", "softdep",
    "symbols", "symbols.bin", "weakdep"))


@dataclass(frozen=True)
class Record:
    folders: tuple[str, ...] = ()
    files: tuple[str, ...] = ()


def _checked_path(value: object) -> bool:
    return (isinstance(value, str) and value.startswith("/") and "\0" not in value
            and all(c not in ("", ".", "..") for c in value[1:].split("/")))


def read(layout: Layout, name: str) -> Record:
    """The record `name` (CREATED or JOURNAL) in nodeprep's state folder; empty when there is none.
    InputError naming the file and field when it is not what nodeprep writes."""
    path = layout.state_dir / name
    raw = imagefile.read(path, limit=imagefile.MAX_RECORD, what="a record nodeprep writes")
    if raw is None:
        return Record()
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        raise InputError(f"{path}: not JSON; nodeprep writes it atomically, so it was edited by hand",
                         hint="fix or delete it; nothing was changed") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object", hint="fix or delete it; nothing was changed")
    out: dict[str, tuple[str, ...]] = {}
    for key in ("folders", "files"):
        value = data.get(key, [])
        if not isinstance(value, list):
            raise InputError(f"{path}: {key}: expected a list", hint="fix or delete it; nothing was changed")
        for i, item in enumerate(value):
            if not _checked_path(item):
                raise InputError(f"{path}: {key}[{i}]: {str(item)[:60]!r} is not an absolute path",
                                 hint="fix or delete it; nothing was changed")
        out[key] = tuple(value)
    return Record(**out)


def ours(folder: str, own: Iterable[str]) -> bool:
    """A folder nodeprep's writes can create: above one of the node paths `own` (or on a module
    link's path), two components deep at least (never /, /etc, /usr, /var, /opt)."""
    if folder.count("/") < 2:
        return False
    return MODULE_TREE.fullmatch(folder) is not None or any(p.startswith(folder + "/") for p in own)


def trusted(layout: Layout, name: str, own: Iterable[str]) -> tuple[Record, list[str]]:
    """The entries of the record `name` that nodeprep could have made (ours, CACHES), and one line
    for each other entry, left in place."""
    record = read(layout, name)
    own = set(own)
    where = layout.node_path(layout.state_dir / name)
    folders = [f for f in record.folders if ours(f, own)]
    files = [f for f in record.files if f in CACHES]
    kept = [f"{p}: named in {where} but not a path nodeprep makes; left in place"
            for p in [*record.folders, *record.files] if p not in folders and p not in files]
    return Record(tuple(folders), tuple(files)), kept


def note(layout: Layout, paths: Iterable[Path], *, caches: bool = False,
         made: Callable[[Path], bool] = os.path.lexists) -> None:
    """Before nodeprep writes `paths` (host paths beneath the root), add to created.json the folders
    above them that do not exist yet, and with `caches` the CACHES missing now (an ldconfig follows).
    Nothing is written when nothing new is missing."""
    old = read(layout, CREATED)
    folders = list(old.folders)
    root = Path(layout.root)
    for path in paths:
        for parent in path.parents:
            if parent == root or not parent.is_relative_to(root):
                break
            node = layout.node_path(parent)
            if node.count("/") >= 2 and not made(parent) and node not in folders:
                folders.append(node)
    files = list(old.files) + [c for c in CACHES if caches and c not in old.files
                               and not made(layout.resolved(c))]
    if (tuple(folders), tuple(files)) != (old.folders, old.files):
        layout.state_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(layout.state_dir / CREATED, json.dumps({"folders": folders, "files": files}) + "\n")
