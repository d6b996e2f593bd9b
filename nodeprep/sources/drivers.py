"""Which Debian source package carries which NVIDIA kernel driver.

Debian ships the kernel-module sources of several driver branches side by side:

    nvidia-kernel-source              current branch, proprietary (non-free)
    nvidia-open-kernel-source         current branch, open modules (contrib)
    nvidia-tesla-<branch>-kernel-source, nvidia-tesla-kernel-source   datacenter branches
    nvidia-tesla-<branch>-open-kernel-source                          (where served)

Each .deb holds `/usr/src/<name>.tar.xz` with the tree `modules/<name>/` (Kbuild, Makefile,
nvidia/, nvidia-uvm/, ...), the same tree an NVIDIA `.run` installer has as kernel/ or kernel-open/.

The mapping is pure: `catalog` is `{package: [debian versions, newest first]}` as the archive
answers it (see `load_catalog`), so it can be tested against recorded archive data.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import targets
from ..errors import InputError
from ..vocab import DRIVER_REQUEST_RE, FLAVOURS, Flavour, version_key

if TYPE_CHECKING:
    from ..targets import TargetOS

PACKAGE_RE = re.compile(r"^nvidia(?:-tesla(?:-(?P<branch>\d+))?)?(?P<open>-open)?-kernel-source$")
# apt-cache search takes a POSIX ERE.
PACKAGE_SEARCH = r"^nvidia(-tesla(-[0-9]+)?)?(-open)?-kernel-source$"


@dataclass(frozen=True)
class DriverSource:
    """One served driver: the Debian package and version that carry its kernel sources."""

    package: str
    debian_version: str
    driver_version: str
    flavour: Flavour

    @property
    def tarball(self) -> str:
        """Path of the source tarball inside the .deb."""
        return f"usr/src/{self.package.removesuffix('-source')}.tar.xz"


def debian_version_to_driver(version: str) -> str:
    """'535.309.01-0+deb12u1' -> '535.309.01' (same rule as nodeprep.sources.debian)."""
    upstream = version.split(":", 1)[-1]
    if "-" in upstream:
        upstream = upstream.rsplit("-", 1)[0]
    return upstream.split("~", 1)[0].split("+", 1)[0]


def package_flavour(package: str) -> Flavour | None:
    m = PACKAGE_RE.match(package)
    if not m:
        return None
    return "open" if m["open"] else "proprietary"


def _preference(package: str) -> int:
    """Among packages serving the same driver version, prefer the plain one, then tesla-<branch>."""
    m = PACKAGE_RE.match(package)
    assert m
    if package.startswith("nvidia-tesla"):
        return 1 if m["branch"] else 2
    return 0


def served(catalog: Mapping[str, list[str]]) -> list[DriverSource]:
    """Every served driver, newest driver version first (one entry per driver version + flavour)."""
    found: dict[tuple[str, str], DriverSource] = {}
    for package in sorted(catalog, key=_preference_key):
        flavour = package_flavour(package)
        if flavour is None:
            continue
        for debver in catalog[package]:  # newest Debian revision first
            driver = debian_version_to_driver(debver)
            found.setdefault((driver, flavour), DriverSource(package, debver, driver, flavour))
    return sorted(
        found.values(),
        key=lambda s: (version_key(s.driver_version), s.flavour == "proprietary"),
        reverse=True,
    )


def _preference_key(package: str) -> tuple[int, str]:
    return (_preference(package) if PACKAGE_RE.match(package) else 9, package)


def served_versions(catalog: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """{flavour: [driver versions, newest first]}."""
    out: dict[str, list[str]] = {f: [] for f in FLAVOURS}
    for s in served(catalog):
        out[s.flavour].append(s.driver_version)
    return out


def resolve(catalog: Mapping[str, list[str]], driver: str | None, flavour: str) -> DriverSource:
    """The source for `driver` (exact version, a branch like '535', or None for the newest)."""
    if flavour not in FLAVOURS:
        raise InputError(f"--flavour: {flavour!r} is not one of {', '.join(FLAVOURS)}")
    if driver is not None and not DRIVER_REQUEST_RE.fullmatch(driver):
        raise InputError(
            f"--driver: {driver!r} is not a driver version (like 535.309.01 or a branch like 535)"
        )
    candidates = [s for s in served(catalog) if s.flavour == flavour]
    if driver is not None:
        candidates = [
            s for s in candidates if s.driver_version == driver or s.driver_version.startswith(driver + ".")
        ]
    if candidates:
        return candidates[0]
    offered = served_versions(catalog)
    listing = "; ".join(f"{f}: {', '.join(v) or 'none'}" for f, v in offered.items())
    what = f"driver {driver}" if driver else "no driver"
    raise InputError(f"--driver: {what} ({flavour}) is not served by Debian's archive (served: {listing})")


def resolve_in_line(
    catalog: Mapping[str, list[str]],
    driver: str | None,
    flavour: str,
    *,
    version_tag: str | None,
    line: str,
) -> DriverSource:
    """`resolve` among the driver sources of one kernel line: with `version_tag` (a backports
    line, "~bpo12") only the Debian versions carrying it; a driver served only outside the line
    is refused naming the line's own choices (those are the sources made for its kernels)."""
    if not version_tag:
        return resolve(catalog, driver, flavour)
    mine = {p: [v for v in vs if version_tag in v] for p, vs in catalog.items()}
    mine = {p: vs for p, vs in mine.items() if vs}
    try:
        return resolve(mine, driver, flavour)
    except InputError:
        pass
    own = served_versions(mine)
    offer = "; ".join(f"{f}: {', '.join(v)}" for f, v in own.items() if v) or "none"
    what = f"--driver: driver {driver} ({flavour}) is" if driver else f"--flavour: the {flavour} flavour is"
    raise InputError(
        f"{what} not built for {line}: the driver sources of that line ({version_tag}) are {offer}; the "
        "mainline sources are made for the release's own kernels. Choose one of those (--driver, "
        "--flavour), or a kernel of the release's main line"
    )


def load_catalog(archive: Any, packages: tuple[str, ...] | None = None,
                 suite: str | None = None) -> dict[str, list[str]]:
    """{package: versions} for the NVIDIA kernel source packages `packages` (default: every one
    `archive` serves; with `suite`, only the versions that suite serves); packages the archive does
    not serve are left out."""
    if packages is None:
        packages = tuple(p for p in archive.packages(PACKAGE_SEARCH) if PACKAGE_RE.match(p))
    found = {p: archive.versions(p, suite) if suite else archive.versions(p) for p in packages}
    return {p: v for p, v in found.items() if v}


def source_line(target: TargetOS, kernel: str | None, channel: Any = None) -> tuple[Any, Any, str]:
    """(the OS whose driver sources a build for `target`/`kernel` takes, the kernel line those
    sources are chosen in, that line described for messages). `channel` (a targets.Channel of
    `target`) names the line when the kernel is not known yet."""
    source_os = targets.sources_of(target)
    if target.borrows_sources:
        line = source_os.channels[0]
    else:
        line = channel if channel is not None else targets.channel(target, kernel)
    return source_os, line, f"{target.name} {line.name} kernel {kernel or '(default)'}, {line.kernel_series}"


def source_packages(source_os: Any) -> tuple[str, ...]:
    """Every driver source package of a target OS, all flavours."""
    return tuple(p for pkgs in source_os.driver_packages.values() for p in pkgs)


def resolve_for_target(
    archive: Any, target: TargetOS, kernel: str | None, driver: str | None, flavour: str,
    driver_suite: str | None = None,
) -> DriverSource:
    """The driver source for a build for `target`/`kernel` from `archive` (that OS's archive, or
    the one it borrows): the OS entry's source packages of `flavour`, within the kernel's line, or
    among those `driver_suite` serves (experimental) when given."""
    source_os, line, described = source_line(target, kernel)
    if driver_suite:
        return resolve_in_line(load_catalog(archive, source_packages(source_os), driver_suite), driver,
                               flavour, version_tag=None, line=f"{described}, from {driver_suite}")
    return resolve_in_line(
        load_catalog(archive, source_packages(source_os)),
        driver,
        flavour,
        version_tag=line.driver_version_tag,
        line=described,
    )
