"""RHEL 9 (and rebuilds): --builder host inside images/rhel-9/ (per-kernel image, kernel-devel).

Driver sources and user space are borrowed from Debian 12 (`sources_from`)."""

from .base import Channel, TargetOS

TARGET = TargetOS(
    name="rhel-9",
    family="rhel",
    builder="host",
    image="rhel-9",
    kernel_headers="kernel-devel-{release}",
    kernel_image="kernel-core-{release}",
    compiler="gcc",
    channels=(
        Channel(
            name="main",
            suites=(),
            kernel_re=r"\d+\.\d+\.\d+-[0-9.]+\.el9[_0-9]*\.[a-z0-9_]+",
            compiler="gcc",
            kernel_series="RHEL 9 kernels, named like 5.14.0-427.13.1.el9_4.x86_64",
        ),
    ),
    driver_packages={
        "proprietary": ("nvidia-kernel-source", "nvidia-tesla-535-kernel-source"),
        "open": ("nvidia-open-kernel-source",),
    },
    sources_from="debian-12",
)
