"""NVIDIA's own Kubernetes GPU stack as test consumers of a nodeprep node, and the stand-ins that let
them run on a machine without a GPU.

The binaries (nvidia-ctk, nvidia-cdi-hook, nvidia-container-runtime from nvidia-container-toolkit
v1.20.0; gpu-feature-discovery and nvidia-device-plugin from k8s-device-plugin v0.20.0;
nvidia-validator from gpu-operator v26.7.0, built from their public sources) are found through one
variable, `NODEPREP_NVIDIA_BIN`: a directory holding them plain or as `NAME.zst`. `.ci/run` points it
at ../shared/nvidia when that is beside the clone; without it the tests that need them are skipped.
Each is checked against `nvidia-binaries.sha256` beside this file and decompressed once into
`<test cache>/nvidia/<sha256>/NAME` (tests/support/binaries.py, shared with the Kubernetes ones).

Without a GPU, NVIDIA's user space answers in known ways, and the stand-ins answer the same:
- `nvidia-smi` exits 9 when it cannot talk to the kernel driver: `EXIT_9_ELF` is a static x86-64
  ELF of 12 instructions' worth that exits 9 (it runs in any root, no libc needed);
- `libnvidia-ml`'s nvmlInit returns NVML_ERROR_DRIVER_NOT_LOADED (9): `NVML_STANDIN_C` does too and
  prints which driver version's library answered, so a consumer's log shows which root it loaded.
"""

from __future__ import annotations

import os
import shutil
import stat
import struct
from pathlib import Path

from tests.support import binaries

ENV = "NODEPREP_NVIDIA_BIN"
BINARIES = ("nvidia-ctk", "nvidia-cdi-hook", "nvidia-container-runtime", "gpu-feature-discovery",
            "nvidia-device-plugin", "nvidia-validator")
SHA_FILE = Path(__file__).with_name("nvidia-binaries.sha256")

NVML_STANDIN_C = r"""
#include <stdio.h>
typedef int nvmlReturn_t;
static nvmlReturn_t no_driver(const char *f) {
    fprintf(stderr, "stand-in libnvidia-ml %s: %s -> NVML_ERROR_DRIVER_NOT_LOADED\n", DRIVER_VERSION, f);
    return 9;
}
nvmlReturn_t nvmlInit_v2(void) { return no_driver("nvmlInit_v2"); }
nvmlReturn_t nvmlInit(void) { return no_driver("nvmlInit"); }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return no_driver("nvmlInitWithFlags"); }
nvmlReturn_t nvmlShutdown(void) { return 9; }
const char *nvmlErrorString(nvmlReturn_t r) { return r == 9 ? "Driver Not Loaded" : "Unknown Error"; }
"""


def skip_reason() -> str | None:
    """Why the tests with NVIDIA's binaries cannot run here (None when they can)."""
    where = os.environ.get(ENV)
    if not where:
        return (f"{ENV} is not set: it names a directory with NVIDIA's GPU stack binaries "
                "(.ci/run points it at ../shared/nvidia)")
    missing = binaries.missing(ENV, BINARIES)
    if missing:
        return f"{ENV}={where} lacks {', '.join(missing)}"
    if os.geteuid() != 0:
        return "the consumers run chrooted into the node root: needs root"
    return None


def nvidia_binaries(cache: Path) -> dict[str, Path]:
    """Paths of the six binaries, sha256-verified; .zst ones decompressed once into the cache."""
    return binaries.verified(ENV, BINARIES, SHA_FILE, cache / "nvidia")


def exit_status_elf(status: int) -> bytes:
    """A static x86-64 ELF executable that exits with `status` (mov edi,N; mov eax,60; syscall)."""
    code = bytes([0xBF]) + struct.pack("<I", status) + bytes([0xB8, 60, 0, 0, 0, 0x0F, 0x05])
    base, ehsize, phsize = 0x400000, 64, 56
    total = ehsize + phsize + len(code)
    header = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8) + struct.pack(
        "<HHIQQQIHHHHHH", 2, 0x3E, 1, base + ehsize + phsize, ehsize, 0, 0, ehsize, phsize, 1, 0, 0, 0)
    program = struct.pack("<IIQQQQQQ", 1, 5, 0, base, base, total, total, 0x1000)
    return header + program + code


EXIT_9_ELF = exit_status_elf(9)


def shared_libraries(binary: Path) -> list[Path]:
    """The shared objects the dynamic loader maps for `binary` (its interpreter included), from ldd."""
    from nodeprep import runner

    out = runner.run(["ldd", binary], timeout=60, check=False).stdout  # a static one: none
    return sorted({Path(w) for line in out.splitlines() for w in line.split() if w.startswith("/")})


def copy_into_root(root: Path, binary: Path, dest: str) -> Path:
    """Copy `binary` to ROOT/`dest` with the host's shared libraries it needs at their own paths (a
    root with glibc, as every distribution has), so it runs chrooted into ROOT."""
    for lib in shared_libraries(binary):
        target = root / str(lib).lstrip("/")
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(lib.resolve(), target)
    out = root / dest.lstrip("/")
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(binary, out)
    return out


def dev_null(root: Path) -> None:
    """ROOT/dev/null as the character device (1, 3)."""
    (root / "dev").mkdir(exist_ok=True)
    os.mknod(root / "dev" / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
