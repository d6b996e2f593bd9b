"""Target OSes: one module per OS says everything nodeprep knows about it.

Each module holds one frozen `TargetOS` (archive suites, compiler, kernel package names and their
ABI naming per kernel line, driver source packages per flavour, which builder, whose archive it
borrows). Every other module asks `get(name)`; an OS not listed here is an input error.
Adding an OS: a new module with its `TargetOS`, one line in `_ALL`, and its images/<os>/ recipe.
"""

from __future__ import annotations

from ..errors import InputError
from . import debian12, debian13, rhel9, ubuntu
from .base import Archive, Channel, TargetOS

__all__ = ["DEFAULT", "Archive", "Channel", "TargetOS", "archive", "channel", "get", "line_kernel", "names"]

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


def line_kernel(name: str, kernel: str | None, builder: str) -> str | None:
    """The kernel that picks the line for a build: `kernel` itself, except that a host build for a
    kernel named like none of the OS's lines (a custom kernel on a build host) uses the main line."""
    if builder == "host" and kernel is not None:
        if not any(c.matches(kernel) for c in get(name).channels):
            return None
    return kernel


def archive(name: str, kernel: str | None = None, driver_suite: str | None = None) -> Archive:
    """The Debian archive suites for OS `name` (and the kernel line of `kernel`, and the driver
    suite `driver_suite`): an OS that borrows another's sources gets that OS's main archive."""
    target = get(name)
    if target.borrows_sources:
        if driver_suite is not None:
            raise InputError(f"--driver-suite: {name} takes its driver sources from {target.sources_from}")
        return get(target.sources_from or "").archive()
    if not target.suite:
        raise InputError(f"--os: {name} has no package archive nodeprep can reach")
    try:
        return target.archive(channel(target, kernel), driver_suite)
    except ValueError as e:
        raise InputError(f"--driver-suite: {e}") from None
