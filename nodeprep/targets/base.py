"""What nodeprep knows about one target OS, in one frozen record (see nodeprep.targets)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Archive:
    """The apt suites one set of packages comes from (what DebianArchive configures)."""

    name: str  # the target OS, e.g. debian-12
    suite: str  # codename, e.g. bookworm
    suites: tuple[str, ...]  # main archive suites, e.g. (bookworm, bookworm-updates, bookworm-backports)
    security_suite: str | None  # e.g. bookworm-security
    key: str  # apt state directory name, e.g. debian-12 or debian-12-backports
    driver_suite: str | None = None  # the suite driver sources come from (TargetOS.driver_suites)


@dataclass(frozen=True)
class Channel:
    """One line of kernels of a target OS and the archive suites and driver sources that go with it.

    `kernel_re` tells the channel from a kernel release's name (Debian 12's own kernels are
    `6.1.0-NN-amd64`, its backports kernels `6.12.NN+deb12-amd64`). Drivers come from the driver
    source packages of `driver_packages`; with `driver_version_tag` only their versions carrying
    that tag (the backports builds, `~bpo12`) count, because the mainline driver sources of the
    release are made for the release's own kernel line."""

    name: str  # "main", "backports"
    suites: tuple[str, ...]
    kernel_re: str
    compiler: str  # package of the compiler the channel's kernels were built with
    kernel_series: str  # human description, e.g. "6.1" or "6.12 (bookworm-backports)"
    driver_version_tag: str | None = None  # Debian version marker of this channel's driver sources
    # Build root packages the line's kernels need besides the OS's own (their linux-kbuild Depends):
    # a line with these gets a build root of its own.
    buildroot_extra: tuple[str, ...] = ()

    def matches(self, kernel: str) -> bool:
        return re.fullmatch(self.kernel_re, kernel) is not None


@dataclass(frozen=True)
class TargetOS:
    """Everything nodeprep knows about building for one target OS."""

    name: str  # nodeprep's OS name, e.g. debian-13
    family: str  # debian, ubuntu, rhel
    builder: str  # default builder: "chroot" (mmdebstrap build root) or "host" (image with headers)
    image: str  # images/<image>/ holds the recipe (Containerfile, packages.list)
    kernel_headers: str  # header package name pattern, "{release}" replaced
    kernel_image: str  # kernel image package name pattern
    compiler: str  # package of the compiler that builds the OS's default kernels
    channels: tuple[Channel, ...]  # first one is the default kernel line
    # Driver source packages per flavour (exact Debian package names, in order of preference).
    driver_packages: dict[str, tuple[str, ...]] = field(default_factory=dict)
    suite: str | None = None  # Debian codename of the OS itself (chroot build root, archive)
    security_suite: str | None = None
    buildroot_packages: tuple[str, ...] = ()  # chroot builder: packages besides minbase
    # What the user-space tools built from NVIDIA's sources (nvidia-persistenced: plain make, RPC
    # over libtirpc, its man page through m4) need besides the build root's own packages: added as
    # a cached layer over the build root (buildroot.with_debs), so the kmod builds' roots and input
    # digests stay as they are.
    tools_packages: tuple[str, ...] = ("libtirpc-dev", "m4")
    # Where driver sources and user space come from: the target itself, or another target whose
    # archive it borrows (host builds for Ubuntu/RHEL take Debian 12's driver sources).
    sources_from: str | None = None
    smoke_boot: bool = False  # its kernels are served by its archive and can be booted in qemu
    # images/<builder_image>/Containerfile is the container `--builder podman|docker` runs the build
    # in (default: `image`). A chroot build makes its own build root, so the container only needs
    # mmdebstrap and nodeprep's runtime: Debian 13 builds in Debian 12's container.
    builder_image: str | None = None
    # Debian suites that may supply a build's driver sources and user space instead of the kernel
    # line's own (`build-driver --driver-suite experimental`): the kernel, its headers and the build
    # root stay the target's; only the driver packages that suite serves are candidates.
    driver_suites: tuple[str, ...] = ()

    @property
    def has_buildroot(self) -> bool:
        return bool(self.suite and self.buildroot_packages)

    @property
    def borrows_sources(self) -> bool:
        return self.sources_from is not None and self.sources_from != self.name

    def channel_for(self, kernel: str | None) -> Channel:
        """The kernel line `kernel` belongs to (None: the default line)."""
        if kernel is None:
            return self.channels[0]
        for ch in self.channels:
            if ch.matches(kernel):
                return ch
        lines = "; ".join(f"{c.name}: {c.kernel_series} like /{c.kernel_re}/" for c in self.channels)
        raise ValueError(f"{kernel!r} is not a kernel release of {self.name} ({lines})")

    def channel_named(self, name: str) -> Channel:
        """The kernel line called `name` ("main", "backports"); ValueError naming the lines otherwise."""
        for ch in self.channels:
            if ch.name == name:
                return ch
        raise ValueError(f"{self.name} has no kernel channel {name!r} "
                         f"(channels: {', '.join(c.name for c in self.channels)})")

    def archive(self, channel: Channel | None = None, driver_suite: str | None = None) -> Archive:
        """The archive suites of `channel` (default: the main line) of this Debian target, with
        `driver_suite` (one of `driver_suites`) added when given."""
        if not self.suite:
            raise ValueError(f"{self.name} has no Debian archive of its own")
        ch = channel or self.channels[0]
        key = self.name if ch is self.channels[0] else f"{self.name}-{ch.name}"
        if driver_suite is None:
            return Archive(self.name, self.suite, ch.suites, self.security_suite, key)
        if driver_suite not in self.driver_suites:
            raise ValueError(f"{driver_suite!r} is not a driver suite of {self.name} "
                             f"(known: {', '.join(self.driver_suites) or 'none'})")
        return Archive(self.name, self.suite, (*ch.suites, driver_suite), self.security_suite,
                       f"{key}-{driver_suite}", driver_suite)
