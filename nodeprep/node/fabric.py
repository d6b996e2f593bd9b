"""Whether this machine needs NVIDIA Fabric Manager, from PCI facts alone (EKS AL2023's conditions).

Fabric Manager configures an NVSwitch fabric the host manages; where there is none it exits with
NV_WARN_NOTHING_TO_DO. The machine types, in the order they are tried (`decide`, pure):

- GB200 / GB300 NVL: an NVIDIA device 0x2941, 0x31c2 or 0x31c3. No: the rack's switch trays manage
  the fabric off-host (tried first: whatever else the board shows).
- HGX/DGX A100, H100, H200: NVIDIA devices of class 0x0680 (bridge: other; the driver claims them as
  NVSwitches). Yes.
- HGX B200 / B300: a Mellanox (0x15b3) function whose VPD carries `SW_MNG` (a ConnectX-7 NVSwitch
  management bridge; NVLink5 switches are not PCI devices of the host). Yes.
- anything else: no.

`read_pci(sysfs_root)` reads the facts (bounded reads of vendor, device, class, and the VPD of
Mellanox functions only); a machine whose PCI devices cannot be listed needs it (undetermined:
start, as EKS's condition does, so a read error never silently skips Fabric Manager on an HGX).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import pci, sysfs
from ..pci import NVIDIA_VENDOR as NVIDIA

MELLANOX = 0x15B3
NVSWITCH_CLASS = 0x0680
OFF_HOST = {0x2941: "GB200", 0x31C2: "GB300", 0x31C3: "GB300"}
SW_MNG = b"SW_MNG"
VPD_LIMIT = 32 << 10  # PCI VPD is at most 32 KiB
ATTR_LIMIT = 64  # vendor, device, class: "0x10de"; a longer one is no fact


@dataclass(frozen=True)
class PciDevice:
    bdf: str
    vendor: int
    device: int
    pci_class: int  # the 16-bit class and subclass (0x0680), no prog-if
    sw_mng: bool = False  # its VPD carries SW_MNG (read for Mellanox functions only)


@dataclass(frozen=True)
class Machine:
    name: str
    needs: bool
    rule: str


MACHINES = (
    Machine("GB200/GB300 NVL", False, "NVIDIA GPU 0x2941 (GB200), 0x31c2 or 0x31c3 (GB300): NVSwitch fabric "
            "managed off-host"),
    Machine("HGX/DGX A100/H100/H200", True, "NVIDIA devices of PCI class 0x0680 (NVSwitches)"),
    Machine("HGX B200/B300", True, "a Mellanox bridge whose VPD says SW_MNG (NVSwitch management bridge)"),
    Machine("no NVSwitch fabric", False, "none of the above"),
    Machine("undetermined", True, "the PCI devices could not be read: started, never silently skipped"),
)
_BY_NAME = {m.name: m for m in MACHINES}


@dataclass(frozen=True)
class Decision:
    machine: Machine
    reason: str

    @property
    def needed(self) -> bool:
        return self.machine.needs

    def to_dict(self) -> dict[str, object]:
        return {"machine": self.machine.name, "fabric_manager": self.needed, "reason": self.reason}


def decide(devices: tuple[PciDevice, ...] | None) -> Decision:
    """The machine type and whether it needs Fabric Manager (pure; None: the devices were unreadable)."""
    if devices is None:
        return Decision(_BY_NAME["undetermined"], "PCI devices unreadable")
    off = sorted({OFF_HOST[d.device] for d in devices if d.vendor == NVIDIA and d.device in OFF_HOST})
    if off:
        return Decision(_BY_NAME["GB200/GB300 NVL"], f"{'/'.join(off)} GPUs: the NVSwitch fabric is managed "
                        "off-host")
    switches = [d.bdf for d in devices if d.vendor == NVIDIA and d.pci_class == NVSWITCH_CLASS]
    if switches:
        return Decision(_BY_NAME["HGX/DGX A100/H100/H200"], f"{len(switches)} NVSwitch devices (PCI class "
                        f"0x0680: {', '.join(switches)})")
    bridges = [d.bdf for d in devices if d.vendor == MELLANOX and d.sw_mng]
    if bridges:
        return Decision(_BY_NAME["HGX B200/B300"],
                        f"NVSwitch management bridge (VPD SW_MNG: {', '.join(bridges)})")
    return Decision(_BY_NAME["no NVSwitch fabric"], "no NVSwitch device or management bridge on the PCI bus")


def read_pci(sysfs_root: Path) -> tuple[PciDevice, ...] | None:
    """The PCI functions under `sysfs_root`/bus/pci/devices (None: that folder cannot be listed)."""
    try:
        found = pci.pci_devices(sysfs_root)
    except OSError:
        return None
    out = []
    for d in found:
        vendor, device, cls = (d.hex(attr, limit=ATTR_LIMIT) for attr in ("vendor", "device", "class"))
        if vendor is None or device is None or cls is None:
            continue
        sw_mng = False
        if vendor == MELLANOX:
            try:
                sw_mng = SW_MNG in sysfs.read_bytes(d.path / "vpd", limit=VPD_LIMIT)
            except OSError:
                sw_mng = False
        out.append(PciDevice(d.bus_id.lower(), vendor, device, cls >> 8, sw_mng))
    return tuple(out)
