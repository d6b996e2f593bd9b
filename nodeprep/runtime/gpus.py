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
from ..labels import gpu as facts
from ..sysfs import read_attr

log = logging.getLogger(__name__)


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
        gpus.append(GpuDevice(index, int(minor_text), uuid, facts.normalise_bus_id(g.get("id", "")) or None))
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
    for i, d in enumerate(sorted(base.iterdir(), key=lambda p: facts.normalise_bus_id(p.name))):
        info: dict[str, str] = {}
        text = read_attr(d / "information", errors="replace")
        if text is None:
            continue
        for line in text.splitlines():
            k, _, v = line.partition(":")
            info[k.strip()] = v.strip()
        minor = info.get("Device Minor", "")
        if not minor.isdigit():
            continue
        gpus.append(GpuDevice(i, int(minor), info.get("GPU UUID") or None, facts.normalise_bus_id(d.name)))
    return GpuList("procfs", tuple(gpus))


def from_pci(root: Path) -> GpuList:
    """Count only: NVIDIA display/3D controllers in PCI sysfs (nodeprep.labels.gpu.from_sysfs)."""
    try:
        found = facts.from_sysfs(root / "sys")
    except facts.GpuSourceUnavailable:
        return GpuList("none", ())
    buses = sorted(g.bus_id for g in found.gpus if g.bus_id)
    gpus = tuple(GpuDevice(i, i, None, bus) for i, bus in enumerate(buses))
    warning = (
        f"GPU list from PCI sysfs ({len(gpus)} GPUs): no UUIDs, and /dev/nvidia<N> minors assumed to "
        "follow PCI order; rerun once the driver is loaded"
    )
    return GpuList("pci", gpus, (warning,) if gpus else ())


def discover(root: Path, *, nvidia_smi_xml: Path | None = None) -> GpuList:
    """The GPUs of the node at `root`, from the best source available."""
    if nvidia_smi_xml is not None:
        return from_nvidia_smi_xml(nvidia_smi_xml.read_bytes(), source=str(nvidia_smi_xml))
    if Path(root).resolve() == Path("/") and facts.driver_loaded(Path("/sys")):
        tool = facts.find_nvidia_smi(Path("/"))
        if tool is not None:
            try:
                env = (
                    {"LD_LIBRARY_PATH": str(tool.parent.parent / "lib64")}
                    if "/opt/nvidia/" in str(tool)
                    else {}
                )
                return from_nvidia_smi_xml(runner.run([tool, "-q", "-x"], timeout=30, env=env).stdout)
            except (CommandError, InputError) as e:
                log.warning("nvidia-smi failed (%s); reading the driver's procfs instead", e)
    procfs = from_procfs(root)
    if procfs.gpus:
        return procfs
    return from_pci(root)
