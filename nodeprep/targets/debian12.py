"""Debian 12 "bookworm": 6.1 kernels (gcc-12) and the 6.12 kernels of bookworm-backports."""

from .base import Channel, TargetOS

TARGET = TargetOS(
    name="debian-12",
    family="debian",
    builder="chroot",
    image="debian-12",
    kernel_headers="linux-headers-{release}",
    kernel_image="linux-image-{release}",
    compiler="gcc-12",
    suite="bookworm",
    security_suite="bookworm-security",
    channels=(
        Channel(
            name="main",
            suites=("bookworm", "bookworm-updates"),
            kernel_re=r"6\.1\.0-\d+-[a-z0-9-]+",
            compiler="gcc-12",
            kernel_series="6.1 (bookworm), named 6.1.0-NN-amd64",
        ),
        # Backports kernels are built with bookworm's own gcc-12 and named +deb12; their driver
        # sources are the backports builds of nvidia-kernel-source (535.216.03~bpo12).
        Channel(
            name="backports",
            suites=("bookworm", "bookworm-updates", "bookworm-backports"),
            kernel_re=r"\d+\.\d+\.\d+\+deb12-[a-z0-9-]+",
            compiler="gcc-12",
            kernel_series="6.12 (bookworm-backports), named 6.12.NN+deb12-amd64",
            driver_version_tag="~bpo12",
            # Their linux-kbuild depends on pahole: CONFIG_DEBUG_INFO_BTF_MODULES runs it on every
            # module (modfinal fails with "pahole: not found" without it).
            buildroot_extra=("pahole",),
        ),
    ),
    driver_packages={
        "proprietary": (
            "nvidia-kernel-source",
            "nvidia-tesla-535-kernel-source",
            "nvidia-tesla-470-kernel-source",
            "nvidia-tesla-kernel-source",
        ),
        "open": ("nvidia-open-kernel-source",),
    },
    # The kernel's compiler (gcc-12), make, libc headers for host tools, binutils, the libraries the
    # linux-kbuild-* tools link against (libelf1, libssl3); kmod for modinfo/depmod.
    buildroot_packages=("gcc-12", "make", "libc6-dev", "binutils", "libelf1", "libssl3", "kmod"),
    sources_from="debian-12",
    smoke_boot=True,
    # experimental carries driver branches unstable does not (555.58.02 in 2026-11)
    driver_suites=("experimental",),
)
