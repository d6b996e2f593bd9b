"""Crash-safe file operations: every change is a write to a temporary name in the same directory
followed by rename(2), with fsync of the file and its directory, so a kill -9 at any point leaves
either the old or the new content, never a mix."""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

from ..errors import InputError, StateError
from .crash import crash_point

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


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(top: Path) -> None:
    """fsync every regular file and directory under `top` (before the rename that publishes it, so a
    power loss after an activation cannot leave the new root with empty files)."""
    for dirpath, _dirnames, filenames in os.walk(top):
        for name in filenames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                fd = os.open(p, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        fsync_dir(Path(dirpath))


def atomic_write(path: Path, data: bytes | str, *, mode: int = 0o644, point: str | None = None) -> bool:
    """Write `data` to `path` atomically; returns False (and writes nothing) when unchanged."""
    raw = data.encode() if isinstance(data, str) else data
    try:  # a link in its place is replaced, never read or written through
        if not path.is_symlink() and path.read_bytes() == raw and (path.stat().st_mode & 0o7777) == mode:
            return False
    except (FileNotFoundError, NotADirectoryError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)  # a leftover (or an image's link of that name) is never written through
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(raw)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, mode)
    return _publish(tmp, path, point)


def atomic_symlink(link: Path, target: str, *, point: str | None = None) -> bool:
    """Point `link` at `target` by creating a new symlink and renaming it over the old one;
    returns False when it already points there."""
    try:
        if os.readlink(link) == target:
            return False
    except (FileNotFoundError, OSError):
        pass
    if link.exists() and not link.is_symlink():
        raise StateError(
            f"{link} exists and is not a symlink: not something nodeprep manages",
            hint="move it away, then run the command again",
        )
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".current-{link.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    return _publish(tmp, link, point)


def _publish(tmp: Path, path: Path, point: str | None) -> bool:
    """Rename the finished `tmp` over `path` and fsync the directory (crash point `point` before)."""
    if point:
        crash_point(point)
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return True


def relative_target(link: Path, target: Path) -> str:
    """Relative symlink text from `link`'s real directory to `target`, so links under --root work
    both in the image and on the booted node (/lib may itself be a link to usr/lib)."""
    link_dir = Path(os.path.realpath(link.parent))
    return os.path.relpath(os.path.realpath(target), link_dir)


def clean_temporaries(directory: Path, prefixes: tuple[str, ...]) -> list[Path]:
    """Remove leftovers of an interrupted run (names only nodeprep creates) from `directory`."""
    removed: list[Path] = []
    if not directory.is_dir():
        return removed
    for p in sorted(directory.iterdir()):
        if p.name.startswith(prefixes):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
            removed.append(p)
    return removed
