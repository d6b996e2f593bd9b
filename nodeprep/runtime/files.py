"""Planned file writes: render first, compare with what is on disk, write atomically only when
different. Every writer in nodeprep.join returns FileChange objects, so the CLI's --dry-run and the
Ansible modules' check mode see exactly what an apply would do and report `changed` truthfully."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..atomicfile import atomic_write
from ..errors import InputError
from ..rootpath import beneath

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FileChange:
    """One file the join wants: `path` is on the target system (under root), `content` its bytes."""

    path: Path  # absolute path on the host running nodeprep (ROOT already applied)
    target: str  # the path as the node sees it, e.g. /etc/cdi/nvidia.yaml
    content: bytes = field(repr=False)  # may hold the bootstrap token: never in repr/logs
    mode: int = 0o644
    secret: bool = False  # holds the bootstrap token: never printed, always 0600
    program: bool = False  # a program nodeprep generates (the CDI hook): a plan shows its header only

    @property
    def before(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None

    @property
    def current_mode(self) -> int | None:
        try:
            return self.path.stat().st_mode & 0o7777
        except FileNotFoundError:
            return None

    @property
    def changed(self) -> bool:
        return self.before != self.content or self.current_mode != self.mode

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    def summary(self) -> dict[str, object]:
        """JSON-able description without the content (safe for secrets)."""
        return {
            "path": self.target,
            "mode": f"{self.mode:04o}",
            "changed": self.changed,
            "sha256": None if self.secret else self.sha256,
            "secret": self.secret,
        }


def writable_problem(path: Path, target: str) -> str | None:
    """Why `path` (the node's `target`) cannot be written, or None: its nearest existing ancestor
    must be a writable directory (access(2) also reports read-only mounts and immutable dirs)."""
    d = path.parent
    while not d.exists() and d != d.parent:
        d = d.parent
    if not d.is_dir():
        return f"cannot write {target}: {d} is not a directory"
    if not os.access(d, os.W_OK):
        return f"cannot write {target}: directory {d} is not writable"
    return None


def apply_changes(changes: list[FileChange]) -> list[FileChange]:
    """Write every changed file; returns the ones that were written. Every target is checked
    first, so a file that cannot be written leaves all of them as they were (InputError)."""
    for change in changes:
        problem = writable_problem(change.path, change.target) if change.changed else None
        if problem:
            raise InputError(problem, hint="nothing was written")
    written = []
    for change in changes:
        if not change.changed:
            log.debug("%s unchanged", change.target)
            continue
        atomic_write(change.path, change.content, mode=change.mode)
        log.info("wrote %s", change.path)  # the real path: under --root when there is one
        written.append(change)
    return written


def relocated(changes: list[FileChange], directory: Path) -> list[FileChange]:
    """The same files placed under `directory` instead of the node's root (`join --dry-run
    --output-dir`): a dry run's preview on disk, nothing on the node touched."""
    directory.mkdir(parents=True, exist_ok=True)
    return [FileChange(under(directory, c.target), c.target, c.content, c.mode, c.secret) for c in changes]


def under(root: Path, target: str | os.PathLike[str], *, input_field: str | None = None,
          follow_last: bool = True) -> Path:
    """`target` (absolute, as the node sees it) inside `root`, resolved beneath it as the booted node
    resolves it (nodeprep.rootpath.beneath): an image's links, absolute ones like /var/run -> /run
    included, never lead out of `root`, so nothing is read from or written to the host running
    nodeprep by mistake. `follow_last` False leaves a link in the last component as named (to read
    the link itself). A link loop or a file used as a directory is InputError (exit 2), naming
    `input_field` when the path is an input the user gave (the token file)."""
    try:
        return beneath(Path(root), Path(os.fspath(target)).relative_to("/"), follow_last=follow_last)
    except InputError as e:
        if input_field is None:
            raise
        raise InputError(f"{input_field}: {e.message}", hint=e.hint) from None


@dataclass(frozen=True)
class Seen:
    """A planned file as it was before the apply (a FileChange reads the node each time it is asked):
    what a front-end reports and diffs of an applied plan."""

    target: str
    content: bytes = field(repr=False)
    before: bytes | None = field(repr=False)
    secret: bool
    changed: bool
    described: Mapping[str, object]

    def summary(self) -> dict[str, object]:
        return dict(self.described)


def seen(files: Iterable[FileChange]) -> tuple[Seen, ...]:
    return tuple(Seen(f.target, f.content, f.before, f.secret, f.changed, f.summary()) for f in files)
