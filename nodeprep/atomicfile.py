"""Crash-safe file operations: every change is a write to a temporary name in the same directory
followed by rename(2), with fsync of the file and its directory, so a kill -9 at any point leaves
either the old or the new content, never a mix.

`atomic_write` (bytes), `atomic_stream` (content written as it is made: an artifact's tar stream)
and `publish_file` (a file a tool or a download finished) are nodeprep's one file writer, on the
edges floor so that every floor uses it (node, join, bootstrap, the artifacts and their store, the
downloads, the builder, the CLI's outputs and the Ansible collection's modules): the temporary file
is created with its final mode (never readable by more than that, even for the moment before a
chmod), without following a link at its name.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from .crash import crash_point
from .errors import StateError
from .sysfs import open_regular


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


def temp_name(path: Path) -> Path:
    """The temporary name `atomic_write` writes `path`'s new content under (node/leftovers.py removes
    leftovers of a killed run by this prefix)."""
    return path.with_name(f".tmp-{path.name}.{os.getpid()}")


def open_temp(tmp: Path, mode: int) -> int:
    """A new file at `tmp` for writing, created with `mode` (the umask can only narrow it, and
    fchmod then sets it exactly, before the first byte); never a link or an existing file."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def holds(path: Path, raw: bytes, mode: int) -> bool:
    """True when `path` is a regular file (not a link, not a FIFO) holding exactly `raw` with
    permission bits `mode`."""
    try:
        fd = open_regular(path)
    except OSError:  # absent, a link, a FIFO, a directory: not what we would write
        return False
    try:
        st = os.fstat(fd)
        if st.st_size != len(raw) or (st.st_mode & 0o7777) != mode:
            return False
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(len(raw) + 1) == raw
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes | str, *, mode: int = 0o644, point: str | None = None) -> bool:
    """Write `data` to `path` atomically with permission bits `mode`: a temporary file created with
    that mode, written and fsynced, renamed over `path`, and the directory fsynced. A link at `path`
    is replaced, never written through. Returns False (and writes nothing) when unchanged."""
    raw = data.encode() if isinstance(data, str) else data
    if holds(path, raw, mode):
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    tmp.unlink(missing_ok=True)  # a leftover (or an image's link of that name) is never written through
    fd = open_temp(tmp, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return _publish(tmp, path, point)


@contextlib.contextmanager
def atomic_stream(path: Path, *, mode: int = 0o644, point: str | None = None) -> Iterator[BinaryIO]:
    """A file to write `path`'s new content into as it is made: a temporary file created with `mode`
    beside `path`; when the block ends cleanly it is fsynced and renamed over `path` and the
    directory fsynced, when it fails it is removed and `path` is as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    tmp.unlink(missing_ok=True)
    fd = open_temp(tmp, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _publish(tmp, path, point)


def publish_file(done: Path, path: Path, *, mode: int | None = None, point: str | None = None) -> None:
    """Rename the finished file `done` (same filesystem; a download's `.part`, a tool's output)
    over `path`: fsynced first (and given `mode`), the directory fsynced after."""
    fd = os.open(done, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)
    _publish(done, path, point)


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
