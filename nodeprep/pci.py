"""NVIDIA's PCI devices under a sysfs tree (SYS/bus/pci/devices): the vendor id spelled once and the
one enumeration that doctor, the self-test, the support check, driver.gpus 'node', the labels and the
Fabric Manager check use.
Attributes are read with nodeprep.sysfs.read_attr (bounded, no links followed): a device of an image
is hostile input."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .sysfs import MAX_ATTR, read_attr

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (labels.gpu is a light entry point)
if TYPE_CHECKING:
    from collections.abc import Iterator

NVIDIA_VENDOR = 0x10DE
NVIDIA_VENDOR_ID = f"{NVIDIA_VENDOR:04x}"  # as PCI ids spell it: 10de:DEVICE
GPU_CLASSES = (0x0300, 0x0302)  # VGA compatible and 3D controllers (NVSwitch bridges are not GPUs)
DISPLAY_CLASS = 0x03  # the base class of every display controller


def devices_dir(sys_dir: Path) -> Path:
    return Path(sys_dir) / "bus" / "pci" / "devices"


def nvidia_pci_id(device: int) -> str:
    """'10de:DEVICE' of an NVIDIA device id."""
    return f"{NVIDIA_VENDOR_ID}:{device:04x}"


@dataclass(frozen=True)
class PciDevice:
    path: Path  # SYS/bus/pci/devices/<address>

    @property
    def bus_id(self) -> str:
        return self.path.name

    def hex(self, attr: str, problems: list[str] | None = None, *, limit: int = MAX_ATTR) -> int | None:
        """The attribute as a number (sysfs writes 0x...), None when it is missing or unreadable (with
        one line in `problems` when it is there but unsafe, unreadable or not hexadecimal); longer
        than `limit` bytes is unsafe."""
        text = read_attr(self.path / attr, problems, limit=limit)
        try:
            return int(text.strip(), 16) if text is not None else None
        except ValueError:
            if problems is not None:
                problems.append(f"{self.path / attr}: not a hexadecimal number; ignored")
            return None

    def pci_id(self) -> str | None:
        """'10de:DEVICE[:SUBVENDOR:SUBDEVICE]' (None without a device id)."""
        device = self.hex("device")
        if device is None:
            return None
        subvendor, subdevice = self.hex("subsystem_vendor"), self.hex("subsystem_device")
        sub = f":{subvendor:04x}:{subdevice:04x}" if subvendor is not None and subdevice is not None else ""
        return f"{nvidia_pci_id(device)}{sub}"


def pci_devices(sys_dir: Path) -> list[PciDevice]:
    """Every PCI function (any vendor) under SYS/bus/pci/devices, by address; OSError when that folder
    cannot be listed."""
    base = devices_dir(sys_dir)
    return [PciDevice(path) for path in sorted(base.iterdir())]


def nvidia_devices(sys_dir: Path, problems: list[str] | None = None) -> Iterator[PciDevice]:
    """Every NVIDIA device (any class) under SYS/bus/pci/devices, by address; none without the folder.
    Lazy, so that a caller's reads of one device's attributes follow its vendor's (`problems` order)."""
    for dev in pci_devices(sys_dir) if devices_dir(sys_dir).is_dir() else []:
        if dev.hex("vendor", problems) == NVIDIA_VENDOR:
            yield dev


def nvidia_gpus(sys_dir: Path, problems: list[str] | None = None) -> Iterator[PciDevice]:
    """NVIDIA's display and 3D controllers (GPU_CLASSES) under SYS/bus/pci/devices, by address."""
    for dev in nvidia_devices(sys_dir, problems):
        cls = dev.hex("class", problems)
        if cls is not None and (cls >> 8) in GPU_CLASSES:
            yield dev
