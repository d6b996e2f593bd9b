"""vGPU facts the way GFD finds them (k8s-device-plugin internal/vgpu, v0.20.0): the PCI configuration
space of every NVIDIA device (vendor 0x10de) under <sysfs>/bus/pci/devices. A vGPU guest device has a
vendor-specific capability (id 0x09) whose bytes 3-4 are "VF"; its records lead to the host driver's
version and branch (10 bytes each, NUL-padded). GFD labels `nvidia.com/vgpu.present` true or false,
and sets no vGPU label at all when the devices cannot be read in full (an unprivileged read of
`config` gives 64 bytes, not 256): `read_vgpu` returns None then, with the reason in `problems`
(silently when a device has no `config` file at all, like any missing sysfs attribute).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..pci import devices_dir, nvidia_devices
from ..sysfs import read_bytes

STATUS, STATUS_CAP_LIST, CAP_POINTER, CAP_VENDOR = 0x06, 0x10, 0x34, 0x09
RECORDS_START, FIELD_LEN = 5, 10
CONFIG_MAX = 4096  # PCIe extended configuration space


@dataclass(frozen=True)
class VgpuFacts:
    present: bool
    host_driver_version: str | None = None
    host_driver_branch: str | None = None


def vendor_capability(config: bytes) -> bytes | None:
    """GFD's GetVendorSpecificCapability: the first vendor-specific capability of a config space."""
    if not config[STATUS] & STATUS_CAP_LIST:
        return None
    seen: set[int] = set()
    pos = config[CAP_POINTER]
    while pos and pos not in seen and pos + 2 < len(config):
        cap_id, nxt, length = config[pos], config[pos + 1], config[pos + 2]
        if cap_id == 0xFF:
            break
        if cap_id == CAP_VENDOR:
            return config[pos:pos + length]
        seen.add(pos)
        pos = nxt
    return None


def is_vgpu(capability: bytes) -> bool:
    return len(capability) >= 5 and capability[3:5] == b"VF"


def host_driver(capability: bytes) -> tuple[str, str] | None:
    """GFD's GetInfo: (host driver version, branch) from the record with id 0, or None."""
    pos = RECORDS_START
    record = capability[pos] if pos < len(capability) else 0
    while record != 0 and pos < len(capability):
        step = capability[pos + 1] if pos + 1 < len(capability) else 0
        if step == 0:  # a record of length 0 would loop forever (GFD would too)
            return None
        pos += step
        record = capability[pos] if pos < len(capability) else 0
    start = pos + 2
    if record != 0 or start + 2 * FIELD_LEN > len(capability):
        return None
    version = capability[start:start + FIELD_LEN].decode("latin-1").strip("\0")
    branch = capability[start + FIELD_LEN:start + 2 * FIELD_LEN].decode("latin-1").strip("\0")
    return version, branch


def read_vgpu(sysfs_root: Path, problems: list[str]) -> VgpuFacts | None:
    """vGPU facts of this machine, or None when GFD would set no vGPU label (reason in `problems`)."""
    devices = devices_dir(sysfs_root)
    if not devices.is_dir():
        problems.append(f"{devices} does not exist")
        return None
    found: list[tuple[str, str] | None] = []
    for nvidia in nvidia_devices(sysfs_root, problems):
        dev = nvidia.path
        try:
            config = read_bytes(dev / "config", limit=CONFIG_MAX)
        except (FileNotFoundError, NotADirectoryError):  # no config space at all: silently, as sysfs.py
            return None
        except OSError as e:
            problems.append(f"{dev / 'config'}: {e.strerror or e}")
            return None
        if len(config) < 256:
            problems.append(f"{dev / 'config'}: {len(config)} bytes, not the 256 of a full read "
                            "(GFD runs privileged for this)")
            return None
        cap = vendor_capability(config)
        if cap is not None and is_vgpu(cap):
            found.append(host_driver(cap))
            if found[-1] is None:
                problems.append(f"{dev.name}: vGPU capability without a host driver record")
    if not found:
        return VgpuFacts(present=False)
    info = next((f for f in reversed(found) if f is not None), None)  # GFD: the last device's wins
    return VgpuFacts(True, *(info or (None, None)))
