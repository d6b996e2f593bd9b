"""Which driver a CUDA toolkit needs (Linux x86_64), as data.

Source: NVIDIA's CUDA release notes table "CUDA Toolkit and Corresponding Driver Versions"
(toolkit-bundled driver per release) and the minor-version compatibility rule
(docs.nvidia.com/deploy/cuda-compatibility): from 11.x on, a toolkit runs on any driver of its
major family's minimum (11.x >= 450.80.02, 12.x >= 525.60.13, 13.x >= 580.65.06) with minor-version
compatibility (PTX JIT limits apply). `min_driver` answers the strict question (the toolkit's own
driver); `min_driver_compat` the relaxed one.
"""

from __future__ import annotations

import re

from ..errors import InputError

# CUDA release (GA) -> minimum Linux driver shipped with it
TOOLKIT_DRIVER: dict[str, str] = {
    "13.1": "590.44.01",
    "13.0": "580.65.06",
    "12.9": "575.51.03",
    "12.8": "570.26",
    "12.6": "560.28.03",
    "12.5": "555.42.02",
    "12.4": "550.54.14",
    "12.3": "545.23.06",
    "12.2": "535.54.03",
    "12.1": "530.30.02",
    "12.0": "525.60.13",
    "11.8": "520.61.05",
    "11.7": "515.43.04",
    "11.6": "510.39.01",
    "11.5": "495.29.05",
    "11.4": "470.42.01",
    "11.3": "465.19.01",
    "11.2": "460.27.03",
    "11.1": "455.23",
    "11.0": "450.51.05",
}
# CUDA major -> (minimum driver with minor-version compatibility, first driver of the next family)
FAMILY: dict[int, tuple[str, str | None]] = {
    11: ("450.80.02", "525"),
    12: ("525.60.13", "580"),
    13: ("580.65.06", None),
}

CUDA_RE = re.compile(r"^(\d+)\.(\d+)(?:\.\d+)?$")


def vkey(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


def parse_cuda(version: str) -> str:
    m = CUDA_RE.match(version.strip())
    if not m:
        raise InputError(f"--require-cuda: {version!r} is not a CUDA version (e.g. 12.2)")
    key = f"{int(m[1])}.{int(m[2])}"
    if key not in TOOLKIT_DRIVER:
        raise InputError(
            f"--require-cuda: CUDA {key} is not in nodeprep's table "
            f"(known: {', '.join(sorted(TOOLKIT_DRIVER, key=vkey))})"
        )
    return key


def min_driver(cuda: str) -> str:
    """The driver the CUDA toolkit release `cuda` ships with (strict minimum)."""
    return TOOLKIT_DRIVER[parse_cuda(cuda)]


def max_cuda(driver: str) -> str | None:
    """The newest CUDA release whose toolkit driver `driver` satisfies (strict)."""
    ok = [c for c, d in TOOLKIT_DRIVER.items() if vkey(driver) >= vkey(d)]
    return max(ok, key=vkey) if ok else None


def check(cuda: str, driver: str) -> tuple[bool, str]:
    """(ok, one-line message) for running CUDA `cuda` applications on `driver`."""
    need = min_driver(cuda)
    if vkey(driver) >= vkey(need):
        return (
            True,
            f"CUDA {parse_cuda(cuda)} needs driver >= {need}; "
            f"driver {driver} supports up to CUDA {max_cuda(driver)}",
        )
    major = int(parse_cuda(cuda).split(".")[0])
    family_min, _ = FAMILY.get(major, (need, None))
    compat = (
        f" (minor-version compatibility would accept >= {family_min} with PTX JIT limits)"
        if vkey(driver) >= vkey(family_min)
        else ""
    )
    return False, (
        f"CUDA {parse_cuda(cuda)} needs driver >= {need}, active driver is {driver} "
        f"(supports up to CUDA {max_cuda(driver) or 'none'}){compat}"
    )
