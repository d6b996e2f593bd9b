"""Paths under `--root` as the node sees them: resolved beneath the root the way openat2's
RESOLVE_IN_ROOT does, so an image's own links (absolute, `..`) never lead out of it. Used by every
layer that opens a file under a root (node, join, labels, profile, bootstrap, the collection)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from .errors import InputError

MAX_LINKS = 40  # links followed in one resolution, as the kernel's MAXSYMLINKS


def resolve_in_root(root: str, path: str, *, follow_last: bool = True) -> list[str]:
    """The components, beneath `root`, of the file `path` names when `root` is '/' (openat2's
    RESOLVE_IN_ROOT): a link's absolute target starts again at `root`, `..` stops there, so the
    result never leaves it; every component but the last is a real directory. A missing component
    and those after it are taken as named. `follow_last` False leaves a link in the last component
    as it is. Raises what the kernel would: ENOENT (`..` below a missing name), ENOTDIR, ELOOP."""
    done: list[str] = []
    todo = path.split("/")[::-1]  # the next component on top
    links = 0
    missing = False
    while todo:
        name = todo.pop()
        if name in ("", "."):
            continue
        if name == "..":
            if missing:
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), "/" + "/".join(done))
            if done:
                done.pop()
            continue
        if missing:
            done.append(name)
            continue
        here = os.path.join(root, *done, name)
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            missing = True
            done.append(name)
            continue
        if stat.S_ISLNK(st.st_mode) and (follow_last or todo):
            links += 1
            if links > MAX_LINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), "/" + "/".join([*done, name]))
            text = os.readlink(here)
            if text.startswith("/"):
                done = []
            todo.extend(text.split("/")[::-1])
            continue
        if todo and not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), "/" + "/".join([*done, name]))
        done.append(name)
    return done


def beneath(root: Path, path: str | os.PathLike[str], *, follow_last: bool = True) -> Path:
    """`path` (as the node sees it) on this host under `root`, resolved by resolve_in_root, so an
    image's links (absolute, `..`) never lead out of it. A live root ('/') keeps `path` as named.
    InputError naming the node's path when the image's links cannot be resolved."""
    root = Path(root)
    rel = os.fspath(path).lstrip("/")
    if os.path.realpath(root) == "/":
        return root / rel
    try:
        return root.joinpath(*resolve_in_root(os.fspath(root), rel, follow_last=follow_last))
    except OSError as e:
        raise InputError(
            f"/{rel} under --root {root}: {e.strerror} at {e.filename}",
            hint="fix the links in the image",
        ) from None
