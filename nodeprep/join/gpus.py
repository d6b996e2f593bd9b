"""Which GPUs the CDI spec lists: NVML index, device minor (/dev/nvidia<minor>) and UUID.

Sources, best first: `nvidia-smi -q -x` (index order, UUIDs, minors), the driver's procfs
(/proc/driver/nvidia/gpus/<bus>/information: "GPU UUID", "Device Minor"), and PCI sysfs (count only:
minors are then assumed to follow PCI order, and a warning says so). MIG devices are not listed
(docs/join.md).
"""

from __future__ import annotations

import logging
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from .. import runner
from ..errors import CommandError, InputError

log = logging.getLogger(__name__)

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x030000", "0x030200")  # VGA controller, 3D controller


@dataclass(frozen=True)
class GpuDevice:
    index: int
    minor: int
    uuid: str | None = None
    bus_id: str | None = None


@dataclass(frozen=True)
class GpuList:
    source: str  # nvidia-smi | procfs | pci | none
    gpus: tuple[GpuDevice, ...]
    warnings: tuple[str, ...] = ()


def _bus_key(bus_id: str) -> str:
    """Normalise "00000000:81:00.0" / "0000:81:00.0" to "0000:81:00.0" (lower case)."""
    bus_id = bus_id.strip().lower()
    domain, _, rest = bus_id.partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else bus_id


def from_nvidia_smi_xml(text: str | bytes, *, source: str = "nvidia-smi") -> GpuList:
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise InputError(f"{source}: not nvidia-smi XML ({e})") from None
    gpus = []
    for index, g in enumerate(root.findall("gpu")):
        minor_text = (g.findtext("minor_number") or "").strip()
        uuid = (g.findtext("uuid") or "").strip() or None
        if not minor_text.isdigit():
            raise InputError(f"{source}: GPU {index} has no minor number ({minor_text or 'empty'})")
        gpus.append(GpuDevice(index, int(minor_text), uuid, _bus_key(g.get("id", "")) or None))
    attached = (root.findtext("attached_gpus") or "").strip()
    warnings: tuple[str, ...] = ()
    if attached.isdigit() and int(attached) != len(gpus):
        warnings = (
            f"{source}: reports {attached} attached GPUs but lists {len(gpus)}; the CDI spec lists "
            f"the {len(gpus)} listed",
        )
    return GpuList("nvidia-smi", tuple(gpus), warnings)


def from_procfs(root: Path) -> GpuList:
    base = root / "proc/driver/nvidia/gpus"
    if not base.is_dir():
        return GpuList("none", ())
    gpus = []
    for i, d in enumerate(sorted(base.iterdir(), key=lambda p: _bus_key(p.name))):
        info: dict[str, str] = {}
        try:
            for line in (d / "information").read_text().splitlines():
                k, _, v = line.partition(":")
                info[k.strip()] = v.strip()
        except OSError:
            continue
        minor = info.get("Device Minor", "")
        if not minor.isdigit():
            continue
        gpus.append(GpuDevice(i, int(minor), info.get("GPU UUID") or None, _bus_key(d.name)))
    return GpuList("procfs", tuple(gpus))


def from_pci(root: Path) -> GpuList:
    base = root / "sys/bus/pci/devices"
    found = []
    if base.is_dir():
        for d in sorted(base.iterdir(), key=lambda p: _bus_key(p.name)):
            try:
                vendor = (d / "vendor").read_text().strip().lower()
                cls = (d / "class").read_text().strip().lower()
            except OSError:
                continue
            if vendor == NVIDIA_VENDOR and cls in GPU_CLASSES:
                found.append(_bus_key(d.name))
    gpus = tuple(GpuDevice(i, i, None, bus) for i, bus in enumerate(found))
    warning = (
        (
            f"GPU list from PCI sysfs ({len(gpus)} GPUs): no UUIDs, and /dev/nvidia<N> minors assumed to "
            "follow PCI order; rerun once the driver is loaded"
        )
        if gpus
        else ""
    )
    return GpuList("pci", gpus, (warning,) if warning else ())


def discover(root: Path, *, nvidia_smi_xml: Path | None = None) -> GpuList:
    """The GPUs of the node at `root`, from the best source available."""
    if nvidia_smi_xml is not None:
        return from_nvidia_smi_xml(nvidia_smi_xml.read_bytes(), source=str(nvidia_smi_xml))
    if Path(root).resolve() == Path("/"):
        tool = runner.which("nvidia-smi") or (
            "/opt/nvidia/current/bin/nvidia-smi"
            if Path("/opt/nvidia/current/bin/nvidia-smi").exists()
            else None
        )
        if tool and Path("/sys/module/nvidia").exists():
            try:
                env = {"LD_LIBRARY_PATH": "/opt/nvidia/current/lib64"}
                result = runner.run([tool, "-q", "-x"], timeout=30, env=env)
                return from_nvidia_smi_xml(result.stdout)
            except (CommandError, InputError) as e:
                log.warning("nvidia-smi failed (%s); reading the driver's procfs instead", e)
    procfs = from_procfs(root)
    if procfs.gpus:
        return procfs
    return from_pci(root)
