"""Known facts about NVIDIA drivers and kernels that decide whether a build can exist at all.

Each fact says where it was seen. `nodeprep build-matrix --expand` refuses the cells they rule out,
with the fact's reason, instead of spending a compile on them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..vocab import version_key

# NVIDIA's open GPU kernel modules were first published with R515 (515.43.04, May 2022; the
# NVIDIA/open-gpu-kernel-modules repository starts at that tag). Older branches (470 and before)
# have no open flavour at all.
OPEN_MODULES_FIRST_BRANCH = 515


@dataclass(frozen=True)
class KernelLimit:
    """A driver release that does not build against a kernel series from one version on."""

    driver: str  # exact driver version, or a branch ("550")
    flavours: tuple[str, ...]
    series: str  # upstream kernel series, e.g. "6.12"
    since: str  # first upstream kernel version it fails on, e.g. "6.12.107"
    reason: str
    source: str  # where this was seen
    abi_since: int | None = None  # for ABI-named releases of the series (6.1.0-53-amd64): first ABI
    later_series: bool = False  # also every later series (a kernel interface that is gone for good)

    def refuses(self, driver: str, flavour: str, kernel_release: str) -> bool:
        if flavour not in self.flavours:
            return False
        if driver != self.driver and not driver.startswith(self.driver + "."):
            return False
        upstream = upstream_version(kernel_release)
        if upstream is None:
            abi = abi_number(kernel_release, self.series)
            return abi is not None and self.abi_since is not None and abi >= self.abi_since
        if not upstream.startswith(self.series + ".") and not self.later_series:
            return False
        return version_key(upstream) >= version_key(self.since)


def upstream_version(kernel_release: str) -> str | None:
    """The upstream kernel version a Debian release name carries: '6.12.107+deb13-amd64' ->
    '6.12.107'; None for names without the patch level ('6.1.0-56-amd64' is an ABI name)."""
    m = re.match(r"^(\d+\.\d+\.\d+)\+", kernel_release)
    return m[1] if m else None


def abi_number(kernel_release: str, series: str) -> int | None:
    """The ABI number of a Debian release name of `series`: ('6.1.0-56-amd64', '6.1') -> 56."""
    m = re.match(rf"^{re.escape(series)}\.0-(\d+)-", kernel_release)
    return int(m[1]) if m else None


KERNEL_LIMITS: tuple[KernelLimit, ...] = (
    # Seen compiling 550.163.01 (open) against Debian 13's 6.12.107+deb13-amd64 and later
    # (tests/slow/builder/test_real_build_trixie.py, docs/build.md "Target OSes"): 6.12.107 backported
    # the pci_resize_resource() change that added an argument, and nv-pci.c:237 fails with "too few
    # arguments to function 'pci_resize_resource'"; 6.12.94 was the newest trixie kernel it built
    # against, and has left the archive since. nv-pci.c belongs to the kernel interface layer, the
    # same file in both flavours' trees.
    KernelLimit(
        driver="550.163.01",
        flavours=("proprietary", "open"),
        series="6.12",
        since="6.12.107",
        reason="550.163.01 does not build against kernels 6.12.107 and later: they changed "
        "pci_resize_resource() (nv-pci.c: too few arguments to function 'pci_resize_resource')",
        source="tests/slow/builder/test_real_build_trixie.py",
    ),
    # Seen compiling 535.261.03 (open) against Debian 12's 6.1.0-56-amd64 (docs/build.md "Support
    # table"; tests/slow/builder/test_real_build_cells.py pins 6.1.0-50 for that cell): Debian 12's
    # 6.1.0-53 (6.1.187) and later carry the same pci_resize_resource() change, and the open
    # sources of 535.261.03 call it with the old arguments. The proprietary 535.309.01 handles it.
    KernelLimit(
        driver="535.261.03",
        flavours=("open",),
        series="6.1",
        since="6.1.187",
        abi_since=53,
        reason="535.261.03 (open) does not build against kernels 6.1.187 (Debian 6.1.0-53) and later: "
        "they changed pci_resize_resource() (too few arguments to function 'pci_resize_resource')",
        source="tests/slow/builder/test_real_build_cells.py",
    ),
    # Seen compiling the open-gpu-kernel-modules release 595.45.04 against trixie-backports'
    # 7.3.4+deb13-amd64 (issue 27, the OPEN_SOURCE_CELLS of tests/support/realbuild.py):
    # kernel-open/common/inc/nv-linux.h:1730 includes <linux/of_gpio.h> unconditionally, which the 7.x
    # kernels no longer have ("fatal error: linux/of_gpio.h: No such file or directory"); the header is
    # in trixie's 6.12.117 headers and in none of trixie-backports' (7.2.6 to 7.3.4, 2026-11-26).
    KernelLimit(
        driver="595.45.04",
        flavours=("open",),
        series="7.2",
        since="7.2.0",
        later_series=True,
        reason="595.45.04 (open) does not build against kernels 7.2 and later: its nv-linux.h includes "
        "<linux/of_gpio.h>, which they removed (fatal error: linux/of_gpio.h: No such file or directory)",
        source="tests/slow/builder/test_open_source_build.py",
    ),
    # Not compiled: 580.142's nv-linux.h:1774 has the same unconditional #include <linux/of_gpio.h>
    # (read in the release tarball of tests/support/realbuild.py OPEN_RELEASES), so it fails the same way.
    KernelLimit(
        driver="580.142",
        flavours=("open",),
        series="7.2",
        since="7.2.0",
        later_series=True,
        reason="580.142 (open) does not build against kernels 7.2 and later: its nv-linux.h includes "
        "<linux/of_gpio.h>, which they removed (as 595.45.04's, seen failing on 7.3.4)",
        source="open-gpu-kernel-modules-580.142 kernel-open/common/inc/nv-linux.h:1774",
    ),
)


def refusal(driver: str, flavour: str, kernel_release: str) -> str | None:
    """Why the cell (driver version, flavour, kernel release) cannot be built, or None."""
    if flavour == "open" and driver[:3].isdigit() and int(driver[:3]) < OPEN_MODULES_FIRST_BRANCH:
        return (f"branch {driver[:3]} has no open kernel modules (NVIDIA publishes them from "
                f"R{OPEN_MODULES_FIRST_BRANCH} on)")
    for limit in KERNEL_LIMITS:
        if limit.refuses(driver, flavour, kernel_release):
            return limit.reason
    return None
