"""One nodeprep run at a time per root: an flock on ROOT/var/lib/nodeprep/lock."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat
from collections.abc import Iterator

from ..errors import InputError, StateError
from .layout import Layout

log = logging.getLogger(__name__)


@contextlib.contextmanager
def locked(layout: Layout, *, wait: bool = True) -> Iterator[None]:
    """Hold the node lock; waits (and says so) while another run holds it, or with `wait` False
    refuses (StateError naming the holder's pid). The kernel drops the
    lock when the holder dies, so a kill -9 never leaves it stuck. The lock file is opened without
    following a link (its directory is resolved beneath the root): a link or anything but a regular
    file there is refused, never truncated or written through."""
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    fd = _open_lock(layout)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            if not wait:
                where = layout.node_path(layout.lock_file)
                raise StateError(f"another nodeprep run (pid {holder}) holds {where}",
                                 hint="let it finish, then run it again; nothing was changed") from None
            log.info("waiting for another nodeprep run (pid %s) holding %s", holder, layout.lock_file)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def _open_lock(layout: Layout) -> int:
    path = layout.lock_file
    refused = InputError(f"{layout.node_path(path)} is not a regular file: not nodeprep's lock",
                         hint="remove it, then run the command again")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise refused from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise refused
    return fd
