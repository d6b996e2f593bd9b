"""Reading a file of the root nodeprep works on (`--root` or /) that anyone who wrote the image may
have planted: dpkg's file lists, modules.dep, nodeprep's own records. The path is already resolved
beneath the root (Layout); here it is opened without blocking and without following a last link,
read only when it is a regular file, at most `limit` bytes. A FIFO, device, socket, directory or
link in its place is refused with one InputError line naming the node's path, never waited on."""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from ..sysfs import read_bytes

MAX_RECORD = 1 << 20  # nodeprep's own small JSON records
MAX_LIST = 64 << 20  # a dpkg file list or modules.dep: far above any real one


def read(path: Path, *, limit: int, what: str) -> bytes | None:
    """The bytes of the regular file `path` (beneath the root), None when it does not exist;
    InputError naming it (`what` it is) when it is anything else or larger than `limit`."""
    try:
        return read_bytes(path, limit=limit)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise InputError(f"{path} ({what}): {e.strerror or e}; refused",
                         hint="replace it with what it should be, or remove it; nothing was changed",
                         ) from None
