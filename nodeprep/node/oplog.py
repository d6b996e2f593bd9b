"""The node operation log: ROOT/var/log/nodeprep.log, one line per change a node command made
(`<UTC time> <command>[<pid>]: <what changed>`), so an operator can see what changed a node and when.

Lines are appended with one write(2) on an O_APPEND descriptor (concurrent writers cannot
interleave within a line, earlier lines are never rewritten). Only paths, versions and commands are
logged (never file contents, so never a token). The root is hostile: a log path that leaves the root
through a link, or is not a regular file, is not written; a log that cannot be written costs one
`warning:` line, never the operation that already succeeded.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import time
from collections.abc import Iterable
from pathlib import Path

LOG_FILE = "var/log/nodeprep.log"
MAX_LINE = 4000
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

log = logging.getLogger("nodeprep")


def format_line(command: str, change: str, *, at: float, pid: int) -> str:
    """One log line; control characters (a newline in a hostile path) become `?`."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
    text = _CONTROL.sub("?", f"{stamp} {command}[{pid}]: {change}")
    return text[:MAX_LINE] + "\n"


def _inside(root: Path, path: Path) -> bool:
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


def record(root: Path, command: str, changes: Iterable[str]) -> Path | None:
    """Append one line per change to ROOT/var/log/nodeprep.log; the log's path, or None when there
    was nothing to log or it could not be written (then one warning line says why)."""
    lines = [format_line(command, c, at=time.time(), pid=os.getpid()) for c in changes]
    if not lines:
        return None
    path = Path(root) / LOG_FILE
    try:
        if not _inside(root, path.parent.parent):  # ROOT/var must not lead out of the root
            raise OSError(f"{path.parent.parent} leads outside {root}")
        path.parent.mkdir(parents=True, exist_ok=True)
        if not _inside(root, path.parent):
            raise OSError(f"{path.parent} leads outside {root}")
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                     | os.O_NONBLOCK | os.O_NOCTTY, 0o640)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(f"{path} is not a regular file")
            os.write(fd, "".join(lines).encode("utf-8", "replace"))
        finally:
            os.close(fd)
    except OSError as e:
        log.warning("warning: node operation log %s not written (%s)", path, e)
        return None
    return path

