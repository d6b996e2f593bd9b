"""Debian 13 "trixie": 6.12 kernels named 6.12.NN+deb13-amd64, built with gcc-14."""

from .base import Channel, TargetOS

TARGET = TargetOS(
    name="debian-13",
    family="debian",
    builder="chroot",
    image="debian-13",
    builder_image="debian-12",  # its mmdebstrap makes the trixie build root (images/debian-13/README.md)
    kernel_headers="linux-headers-{release}",
    kernel_image="linux-image-{release}",
    compiler="gcc-14",
    suite="trixie",
    security_suite="trixie-security",
    channels=(
        Channel(
            name="main",
            suites=("trixie", "trixie-updates"),
            kernel_re=r"6\.12\.\d+\+deb13-[a-z0-9-]+",
            compiler="gcc-14",
            kernel_series="6.12 (trixie), named 6.12.NN+deb13-amd64",
        ),
        # trixie-backports' kernels (7.3.4+deb13-amd64 in 2026-11) carry the same +deb13 as trixie's
        # own: the line is told apart by the series. gcc-14 builds them (their headers depend on
        # gcc-14-for-host); their linux-kbuild-<release> depends on pahole, as bookworm-backports'.
        Channel(
            name="backports",
            suites=("trixie", "trixie-updates", "trixie-backports"),
            kernel_re=r"(?!6\.12\.)\d+\.\d+\.\d+\+deb13-[a-z0-9-]+",
            compiler="gcc-14",
            kernel_series="trixie-backports' newer series (7.3 in 2026-11), named 7.3.N+deb13-amd64",
            driver_version_tag="~bpo13",
            buildroot_extra=("pahole",),
        ),
    ),
    driver_packages={
        "proprietary": ("nvidia-kernel-source", "nvidia-tesla-535-kernel-source"),
        "open": ("nvidia-open-kernel-source",),
    },
    # As debian-12, with trixie's names: gcc-14 (its kernels' CONFIG_CC_VERSION_TEXT names
    # x86_64-linux-gnu-gcc-14, which gcc-14 provides) and the 64-bit time_t library names.
    buildroot_packages=("gcc-14", "make", "libc6-dev", "binutils", "libelf1t64", "libssl3t64", "kmod"),
    sources_from="debian-13",
    smoke_boot=True,
    # experimental carries driver branches unstable does not (555.58.02 in 2026-11)
    driver_suites=("experimental",),
)
