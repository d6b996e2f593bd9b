"""One nodeprep run at a time per root: an flock on ROOT/var/lib/nodeprep/lock."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator

from .layout import Layout

log = logging.getLogger(__name__)


@contextlib.contextmanager
def locked(layout: Layout) -> Iterator[None]:
    """Hold the node lock; waits (and says so) while another run holds it. The kernel drops the
    lock when the holder dies, so a kill -9 never leaves it stuck."""
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(layout.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            log.info("waiting for another nodeprep run (pid %s) holding %s", holder, layout.lock_file)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)
