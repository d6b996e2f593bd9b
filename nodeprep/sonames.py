"""The SONAME rule for artifact payloads, shared by `artifact.extract` (install) and
`artifact.verify` (`artifacts verify`): every regular file with an ELF header must be readable by
nodeprep.elf, and its SONAME, if any, must be one plain file name. A soname link is made at
`<library's directory>/<SONAME>`, so a SONAME like `../../tmp/x` would put a link outside it.

Files are read as a little-endian loader reads them (both architectures nodeprep knows are
little-endian), whatever their EI_DATA says.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import IO

from . import elf

BYTEORDER = "<"
NAME_MAX = 255


def unsafe(name: str) -> str | None:
    """Why `name` cannot be a soname link beside its library (None: it can)."""
    if name in ("", ".", ".."):
        return "is not a file name"
    if "/" in name or "\0" in name:
        return "is not a plain file name"
    if not all(" " < c < "\x7f" for c in name):
        return "holds characters other than printable ASCII"
    if len(name.encode()) > NAME_MAX:
        return f"is longer than {NAME_MAX} bytes"
    return None


def read(member: str, fd: int) -> str | None:
    """The SONAME of `member`, open as the regular file `fd` (None: no ELF object, or none);
    ElfError naming `member` when it breaks the rule."""
    if not elf.is_elf(os.pread(fd, 4, 0)):
        return None
    try:
        name = elf.file_soname(fd, byteorder=BYTEORDER)
    except elf.NotElf:
        return None
    except elf.ElfError as e:
        raise elf.ElfError(f"{member}: {e}") from None
    why = unsafe(name) if name is not None else None
    if why:
        raise elf.ElfError(f"{member}: SONAME {name!r} {why}")
    return name


def problem(member: str, fd: int) -> str | None:
    """read()'s refusal as one line (None: `member` keeps the rule)."""
    try:
        read(member, fd)
    except elf.ElfError as e:
        return str(e)
    return None


def tree_problems(top: Path, prefix: str) -> list[str]:
    """problem() of every regular file beneath the directory `top` (walked by directory fds, links
    not followed), each named `prefix/<path below top>`."""
    found = []
    for dirpath, _, filenames, dirfd in os.fwalk(top):
        for name in sorted(filenames):
            member = f"{prefix}/{os.path.relpath(os.path.join(dirpath, name), top)}"
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dirfd)
            except OSError as e:
                if e.errno != errno.ELOOP:  # ELOOP: a symlink, whose target is a file of the tree
                    found.append(f"{member}: cannot be read ({e.strerror})")
                continue
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    line = problem(member, fd)
                    found += [line] if line else []
            finally:
                os.close(fd)
    return found


class Spool:
    """A sink for a member's bytes read from a stream (`artifacts verify` cannot seek in the tar):
    an ELF file is kept in an anonymous temporary file until `problem()` has read it."""

    def __init__(self, member: str) -> None:
        self.member = member
        self._head = b""
        self._file: IO[bytes] | None = None

    def write(self, chunk: bytes) -> None:
        if self._file is None and len(self._head) < 4:
            taken = chunk[:4 - len(self._head)]
            self._head += taken
            chunk = chunk[len(taken):]
            if len(self._head) == 4 and elf.is_elf(self._head):
                self._file = tempfile.TemporaryFile(prefix="nodeprep-elf-")
                self._file.write(self._head)
        if self._file is not None and chunk:
            self._file.write(chunk)

    def problem(self) -> str | None:
        if self._file is None:
            return None
        self._file.flush()
        try:
            return problem(self.member, self._file.fileno())
        finally:
            self._file.close()
            self._file = None
