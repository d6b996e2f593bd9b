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

import pytest

from tests.support import binaries

ENV = "NODEPREP_NVIDIA_BIN"
BINARIES = ("nvidia-ctk", "nvidia-cdi-hook", "nvidia-container-runtime", "gpu-feature-discovery",
            "nvidia-device-plugin", "nvidia-validator")
# NVIDIA's DRA driver's kubelet plugin (k8s-dra-driver-gpu v25.12.0, built from that tag as the others
# are: Go 1.26.11, -mod=vendor, the Makefile's flags; sha256 in the list): not in ../shared/nvidia yet,
# so the test that runs it skips, saying so, where the directory lacks it.
OPTIONAL = ("gpu-kubelet-plugin",)
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
    reason = binaries.unavailable(ENV, BINARIES, "a directory with NVIDIA's GPU stack binaries "
                                  "(.ci/run points it at ../shared/nvidia)")
    if reason:
        return reason
    if os.geteuid() != 0:
        return "the consumers run chrooted into the node root: needs root"
    return None


def optional_binary(cache: Path, name: str) -> Path | str:
    """The path of OPTIONAL binary `name`, sha256-verified, or why it is not at hand."""
    reason = skip_reason()
    if reason:
        return reason
    if binaries.missing(ENV, (name,)):
        return (f"{ENV}={os.environ[ENV]} lacks {name} (NVIDIA/k8s-dra-driver-gpu v25.12.0, "
                "cmd/gpu-kubelet-plugin, built as tests/support/nvidia.py says)")
    return binaries.verified(ENV, (name,), SHA_FILE, cache / "nvidia")[name]


def nvidia_binaries(cache: Path) -> dict[str, Path]:
    """Paths of the six binaries, sha256-verified; .zst ones decompressed once into the cache."""
    return binaries.verified(ENV, BINARIES, SHA_FILE, cache / "nvidia")


def nvidia_binaries_or_skip(cache: Path) -> dict[str, Path]:
    """nvidia_binaries(cache), or the calling test skipped with skip_reason()."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    return nvidia_binaries(cache)


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


# NVIDIA's published compute capability of each product in tests/fixtures/nvidia-smi (CUDA GPUs list):
# the one fact NVML gives that an `nvidia-smi -q -x` capture of those drivers does not hold.
COMPUTE_CAPABILITY = {
    "NVIDIA A100-SXM4-80GB": (8, 0), "Tesla T4": (7, 5), "NVIDIA A10G": (8, 6), "NVIDIA RTX A5000": (8, 6),
    "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition": (12, 0),
}

NVML_CAPTURE_C = r"""
#include <stdio.h>
#include <string.h>
typedef int nvmlReturn_t;
typedef struct { const char *name; unsigned long long mem_mib; int cc_major, cc_minor, mig;
                 const char *bus; unsigned int did; const char *uuid; } gpu_t;
static const gpu_t GPUS[] = { %(gpus)s };
static const unsigned int N = sizeof GPUS / sizeof GPUS[0];
typedef const gpu_t *nvmlDevice_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { char busIdLegacy[16]; unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
                 char busId[32]; } nvmlPciInfo_t;
static nvmlReturn_t copy(char *out, unsigned int len, const char *s) {
    if (strlen(s) + 1 > len) return 7;  /* NVML_ERROR_INSUFFICIENT_SIZE */
    strcpy(out, s); return 0;
}
nvmlReturn_t nvmlInit_v2(void) { return 0; }
nvmlReturn_t nvmlInit(void) { return 0; }
nvmlReturn_t nvmlInitWithFlags(unsigned int f) { (void)f; return 0; }
nvmlReturn_t nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(nvmlReturn_t r) {
    return r == 3 ? "Not Supported" : r ? "Unknown Error" : "Success";
}
nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len) { return copy(v, len, "%(driver)s"); }
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { *v = %(cuda)d; return 0; }
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { *v = %(cuda)d; return 0; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { *n = N; return 0; }
nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { *n = N; return 0; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    if (i >= N) return 2;  /* NVML_ERROR_INVALID_ARGUMENT */
    *d = &GPUS[i]; return 0;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) {
    return nvmlDeviceGetHandleByIndex_v2(i, d);
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *s, unsigned int len) { return copy(s, len, d->name); }
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *s, unsigned int len) { return copy(s, len, d->uuid); }
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    m->total = d->mem_mib << 20; m->free = m->total; m->used = 0; return 0;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    m->total = d->mem_mib << 20; m->reserved = 0; m->free = m->total; m->used = 0; return 0;
}
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *a, int *b) {
    *a = d->cc_major; *b = d->cc_minor; return 0;
}
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *cur, unsigned int *pend) {
    if (d->mig < 0) return 3;  /* NVML_ERROR_NOT_SUPPORTED: not MIG-capable */
    *cur = *pend = (unsigned int)d->mig; return 0;
}
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *n) {
    *n = 0; return d->mig < 0 ? 3 : 0;
}
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int i, nvmlDevice_t *m) {
    (void)d; (void)i; (void)m; return 6;  /* NVML_ERROR_NOT_FOUND */
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) {
    memset(p, 0, sizeof *p); copy(p->busId, sizeof p->busId, d->bus);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%%s", d->bus + 4);
    sscanf(d->bus, "%%x:%%x:%%x", &p->domain, &p->bus, &p->device); p->pciDeviceId = d->did; return 0;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *p) {
    return nvmlDeviceGetPciInfo_v3(d, p);
}
nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t d, nvmlPciInfo_t *p) { return nvmlDeviceGetPciInfo_v3(d, p); }
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *n) {
    *n = (unsigned int)(d - GPUS); return 0;
}
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *n) { *n = (unsigned int)(d - GPUS); return 0; }
"""


def nvml_serving(capture: bytes) -> str:
    """C source of a libnvidia-ml that answers NVML's calls with a `nvidia-smi -q -x` capture's facts
    (name, total memory, MIG mode, PCI bus and device id, UUID, driver and CUDA versions; compute
    capability from COMPUTE_CAPABILITY), read here with ElementTree, independently of nodeprep."""
    import xml.etree.ElementTree as ET

    root = ET.fromstring(capture)
    rows = []
    for g in root.findall("gpu"):
        name = g.findtext("product_name") or ""
        major, minor = COMPUTE_CAPABILITY[name]
        mig = {"Enabled": 1, "Disabled": 0}.get(g.findtext("mig_mode/current_mig") or "", -1)
        memory = int((g.findtext("fb_memory_usage/total") or "0").split()[0])
        rows.append(f'{{"{name}", {memory}ULL, {major}, {minor}, {mig}, "{g.findtext("pci/pci_bus_id")}", '
                    f'0x{g.findtext("pci/pci_device_id")}U, "{g.findtext("uuid")}"}}')
    cmaj, cmin = ((root.findtext("cuda_version") or "0.0").split(".") + ["0"])[:2]
    return NVML_CAPTURE_C % {"gpus": ", ".join(rows), "driver": root.findtext("driver_version"),
                             "cuda": int(cmaj) * 1000 + int(cmin) * 10}
