"""Ubuntu 22.04 and 24.04: built with --builder host inside images/ubuntu-*/ (per-kernel images).

No Ubuntu archive is reachable from nodeprep's own builders: the driver sources and the user space
are Debian 12's (the same NVIDIA sources), borrowed explicitly through `sources_from`."""

from .base import Channel, TargetOS


def _ubuntu(version: str, compiler: str) -> TargetOS:
    return TargetOS(
        name=f"ubuntu-{version}",
        family="ubuntu",
        builder="host",
        image=f"ubuntu-{version}",
        kernel_headers="linux-headers-{release}",
        kernel_image="linux-image-{release}",
        compiler=compiler,
        channels=(
            Channel(
                name="main",
                suites=(),
                kernel_re=r"\d+\.\d+\.\d+-\d+-[a-z0-9-]+",
                compiler=compiler,
                kernel_series="Ubuntu kernels, named like 5.15.0-105-generic",
            ),
        ),
        driver_packages={
            "proprietary": ("nvidia-kernel-source", "nvidia-tesla-535-kernel-source"),
            "open": ("nvidia-open-kernel-source",),
        },
        sources_from="debian-12",
    )


UBUNTU_2204 = _ubuntu("22.04", "gcc-11")  # GA 5.15 kernels; HWE 6.x kernels use gcc-12
UBUNTU_2404 = _ubuntu("24.04", "gcc-13")
