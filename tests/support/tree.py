"""A file tree's snapshot, to assert that a command changed nothing (or exactly something)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path


def snapshot(root: Path, *, skip: tuple[str, ...] = (), times: bool = False) -> dict[str, tuple[object, ...]]:
    """Every path under `root` but those in `skip` (relative, POSIX): its mode and link text, content
    hash or device number (links not followed, devices and FIFOs never opened); with `times` the
    inode and mtime too."""
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            rel = p.relative_to(root).as_posix()
            if rel in skip:
                continue
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                what: tuple[object, ...] = ("link", os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                what = ("file", hashlib.sha256(p.read_bytes()).hexdigest())
            elif stat.S_ISDIR(st.st_mode):
                what = ("dir",)
            else:
                what = ("other", st.st_rdev)
            out[rel] = (st.st_mode, *what, *((st.st_ino, st.st_mtime_ns) if times else ()))
    return out
