"""sysfs trees of 8-GPU machines, for the Fabric Manager decision (nodeprep.node.fabric) and the
self-test: `bus/pci/devices/<bdf>/{vendor,device,class}` as the kernel writes them, and the `vpd` of
Mellanox functions. Built here, not captured: the bus addresses and device ids are those of the NVML
mock's profiles (GPU ids from NVIDIA's supported-gpus.json: H100 SXM5 0x2330, B200 0x2901, GB200
0x2941; NVSwitch 0x22a3, ConnectX-7 0x1021), and the VPD is a PCI VPD image (ID string, VPD-R with
PN/EC/SN/V3 keywords, RV checksum, end tag) whose vendor keyword on a management bridge carries
SMDL=SW_MNG, as NVIDIA's ConnectX-7 bridges of HGX B200 boards do.
"""

from __future__ import annotations

from pathlib import Path

GPU_CLASS = "0x030200"
NVSWITCH_CLASS = "0x068000"
IB_CLASS = "0x020700"


def vpd(product: str, vendor_specific: str) -> bytes:
    """A PCI VPD image: ID string, read-only keywords (RV checksum so the bytes sum to 0), end tag."""
    ident = product.encode()
    fields = b""
    for key, value in (("PN", "MCX750500B-0D00"), ("EC", "A7"), ("SN", "MT2332X00001"),
                       ("V3", vendor_specific)):
        fields += key.encode() + bytes([len(value)]) + value.encode()
    head = bytes([0x82, len(ident) & 0xFF, len(ident) >> 8]) + ident
    ro = bytes([0x90]) + (len(fields) + 4).to_bytes(2, "little") + fields + b"RV" + bytes([1])
    checksum = (-sum(head + ro)) & 0xFF
    return head + ro + bytes([checksum]) + bytes([0x78])


def device(root: Path, bdf: str, vendor: str, dev: str, cls: str, vpd_bytes: bytes | None = None) -> None:
    d = root / "bus" / "pci" / "devices" / bdf
    d.mkdir(parents=True, exist_ok=True)
    (d / "vendor").write_text(vendor + "\n")
    (d / "device").write_text(dev + "\n")
    (d / "class").write_text(cls + "\n")
    if vpd_bytes is not None:
        (d / "vpd").write_bytes(vpd_bytes)


NICS = ("0000:18:00.0", "0000:1c:00.0", "0000:48:00.0", "0000:4c:00.0",
        "0000:88:00.0", "0000:8c:00.0", "0000:c8:00.0", "0000:cc:00.0")
H100_GPUS = ("0000:1a:00.0", "0000:1b:00.0", "0000:4a:00.0", "0000:4b:00.0",
             "0000:8a:00.0", "0000:8b:00.0", "0000:ca:00.0", "0000:cb:00.0")


def hgx_h100(root: Path, driver: str | None = None) -> Path:
    """HGX H100: 8 GPUs, 4 NVSwitches (class 0x0680), 8 ConnectX-7 NICs (no SW_MNG)."""
    for bdf in H100_GPUS:
        device(root, bdf, "0x10de", "0x2330", GPU_CLASS)
    for i in range(4):
        device(root, f"0000:0{5 + i}:00.0", "0x10de", "0x22a3", NVSWITCH_CLASS)
    for bdf in NICS:
        device(root, bdf, "0x15b3", "0x1021", IB_CLASS,
               vpd("NVIDIA ConnectX-7 HHHL adapter card", "MLX:MN=MLNX:CSKU=V2:UUID=V3:PCI=V0"))
    return _module(root, driver)


def hgx_b200(root: Path, driver: str | None = None) -> Path:
    """HGX B200: 8 GPUs, no NVSwitch on PCI; 2 ConnectX-7 NVSwitch management bridges (VPD SW_MNG)
    beside 8 ConnectX-7 NICs (no SW_MNG)."""
    for bdf in H100_GPUS:
        device(root, bdf, "0x10de", "0x2901", GPU_CLASS)
    for i in range(2):
        device(root, f"0000:0{3 + i}:00.0", "0x15b3", "0x1021", IB_CLASS,
               vpd("NVIDIA ConnectX-7 NVSwitch bridge", "MLX:MN=MLNX:SMDL=SW_MNG:CSKU=V2"))
    for bdf in NICS:
        device(root, bdf, "0x15b3", "0x1021", IB_CLASS,
               vpd("NVIDIA ConnectX-7 HHHL adapter card", "MLX:MN=MLNX:CSKU=V2:UUID=V3:PCI=V0"))
    return _module(root, driver)


def gb200(root: Path, driver: str | None = None) -> Path:
    """GB200 NVL compute tray: 4 GB200 GPUs (0x2941) on two Grace sockets, ConnectX-7 NICs; the
    NVSwitches sit in the rack's switch trays."""
    for bdf in ("0008:01:00.0", "0009:01:00.0", "0018:01:00.0", "0019:01:00.0"):
        device(root, bdf, "0x10de", "0x2941", GPU_CLASS)
    for i in range(4):
        device(root, f"000{i}:03:00.0", "0x15b3", "0x1021", IB_CLASS,
               vpd("NVIDIA ConnectX-7 HHHL adapter card", "MLX:MN=MLNX:CSKU=V2:UUID=V3:PCI=V0"))
    return _module(root, driver)


def _module(root: Path, driver: str | None) -> Path:
    if driver:
        (root / "module" / "nvidia").mkdir(parents=True, exist_ok=True)
        (root / "module" / "nvidia" / "version").write_text(driver + "\n")
    return root


MACHINES = {"hgx-h100": hgx_h100, "hgx-b200": hgx_b200, "gb200": gb200}
