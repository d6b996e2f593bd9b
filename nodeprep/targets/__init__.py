"""Target OSes: one module per OS says everything nodeprep knows about it.

Each module holds one frozen `TargetOS` (archive suites, compiler, kernel package names and their
ABI naming per kernel line, driver source packages per flavour, which builder, whose archive it
borrows). A name from outside (`--os`, a matrix file, an archive's OS) is resolved once with
`get(name)`, where it enters; an OS not listed here is an input error. Past that point code passes
the `TargetOS` record itself (a build's `BuildRequest.target`), not its name.
Adding an OS: a new module with its `TargetOS`, one line in `_ALL`, and its images/<os>/ recipe.
"""

from __future__ import annotations

from ..errors import InputError
from . import debian12, debian13, rhel9, ubuntu
from .base import Archive, Channel, TargetOS

__all__ = [
    "DEFAULT", "Archive", "Channel", "TargetOS", "all_targets", "archive", "channel", "get", "line_kernel",
    "names", "sources_of",
]

DEFAULT = "debian-12"
_ALL: tuple[TargetOS, ...] = (
    debian12.TARGET,
    debian13.TARGET,
    ubuntu.UBUNTU_2204,
    ubuntu.UBUNTU_2404,
    rhel9.TARGET,
)
_BY_NAME = {t.name: t for t in _ALL}


def names() -> list[str]:
    return sorted(_BY_NAME)


def all_targets() -> list[TargetOS]:
    """Every target OS, in name order."""
    return [_BY_NAME[n] for n in names()]


def get(name: str, *, what: str = "--os") -> TargetOS:
    """The target OS `name`; InputError naming the known ones otherwise."""
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise InputError(f"{what}: unknown OS {name!r} (known: {', '.join(names())})") from None


def channel(target: TargetOS, kernel: str | None) -> Channel:
    """The kernel line of `target` that `kernel` belongs to; InputError otherwise."""
    try:
        return target.channel_for(kernel)
    except ValueError as e:
        raise InputError(f"--kernel: {e}") from None


def sources_of(target: TargetOS) -> TargetOS:
    """The target OS whose driver sources and user space a build for `target` takes: itself, or
    the OS it borrows them from (`sources_from`)."""
    return get(target.sources_from or "") if target.borrows_sources else target


def line_kernel(target: TargetOS, kernel: str | None, builder: str) -> str | None:
    """The kernel that picks the line for a build: `kernel` itself, except that a host build for a
    kernel named like none of the OS's lines (a custom kernel on a build host) uses the main line."""
    if builder == "host" and kernel is not None:
        if not any(c.matches(kernel) for c in target.channels):
            return None
    return kernel


def archive(target: TargetOS, kernel: str | None = None, driver_suite: str | None = None) -> Archive:
    """The Debian archive suites for `target` (and the kernel line of `kernel`, and the driver
    suite `driver_suite`): an OS that borrows another's sources gets that OS's main archive."""
    name = target.name
    if target.borrows_sources:
        if driver_suite is not None:
            raise InputError(f"--driver-suite: {name} takes its driver sources from {target.sources_from}")
        return sources_of(target).archive()
    if not target.suite:
        raise InputError(f"--os: {name} has no package archive nodeprep can reach")
    try:
        return target.archive(channel(target, kernel), driver_suite)
    except ValueError as e:
        raise InputError(f"--driver-suite: {e}") from None
