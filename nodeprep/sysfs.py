"""Reading small kernel-provided files (sysfs, DMI, procfs) and host facts safely.

A fact source must never hang or crash the labeler or doctor: a FIFO planted where a DMI attribute
should be, a symlink, a huge file or random bytes. `read_attr` opens without blocking and without
following a final symlink (O_NONBLOCK | O_NOFOLLOW), reads only a regular file (S_ISREG on the open
descriptor), at most `limit` bytes, and decodes strictly. A missing file is None, silently; every
other problem is None plus one line appended to `problems` (reported as a fact-source failure).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

MAX_ATTR = 64 * 1024  # a sysfs attribute is at most a page; this is far above any real one


class UnsafeFile(OSError):
    """The path is not a small regular file (FIFO, device, directory, symlink, too large)."""


def open_regular(path: Path, *, follow: bool = False) -> int:
    """A read-only descriptor of `path` if it is a regular file (never blocks on a FIFO).
    FileNotFoundError/NotADirectoryError when absent; UnsafeFile otherwise."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow:  # O_NOFOLLOW met a link (with follow: a loop)
            raise UnsafeFile(e.errno, "is a symbolic link") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafeFile(errno.EINVAL, f"not a regular file ({_kind(st.st_mode)})")
    return fd


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "special file"


def read_bytes(path: Path, *, limit: int = MAX_ATTR, follow: bool = False) -> bytes:
    """At most `limit` bytes of a regular file (UnsafeFile when it holds more)."""
    fd = open_regular(path, follow=follow)
    try:
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 16, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise UnsafeFile(errno.EFBIG, f"larger than {limit} bytes")
    return b"".join(chunks)


def read_attr(path: Path, problems: list[str] | None = None, *, limit: int = MAX_ATTR,
              follow: bool = False, errors: str = "strict") -> str | None:
    """The text of a small regular file, or None: silently when it does not exist, with one line in
    `problems` when it is unsafe, unreadable or not text."""
    try:
        raw = read_bytes(path, limit=limit, follow=follow)
        return raw.decode("utf-8", errors=errors)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except UnicodeDecodeError as e:
        why = f"not text (byte 0x{e.object[e.start]:02x} at offset {e.start} is not UTF-8)"
    except OSError as e:
        why = e.strerror or str(e)
    if problems is not None:
        problems.append(f"{path}: {why}; ignored")
    return None
