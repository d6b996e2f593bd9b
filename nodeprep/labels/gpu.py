"""GPU facts from the best available source: NVML, then `nvidia-smi -q -x`, then PCI sysfs.

Each reader returns GpuFacts or raises; the caller (facts.py) picks the first that works and bounds
the time each may take.
"""

from __future__ import annotations

import logging
import os
import re
import xml.etree.ElementTree as ET
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .. import runner
from ..pci import NVIDIA_VENDOR_ID, PciDevice, devices_dir, nvidia_gpus, nvidia_pci_id
from ..sysfs import read_attr
from . import pciids

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a light entry point)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

log = logging.getLogger(__name__)

PCI_CLASS_VGA = 0x0300
PCI_CLASS_3D = 0x0302
MIG_CAPABLE_CHIPS = frozenset({"GA100", "GH100", "GB100", "GB102"})

# nvidia-smi's <product_architecture> -> GFD family name.
ARCH_FAMILY = {
    "tesla": "tesla", "fermi": "fermi", "kepler": "kepler", "maxwell": "maxwell", "pascal": "pascal",
    "volta": "volta", "turing": "turing", "ampere": "ampere", "ada lovelace": "ada-lovelace",
    "hopper": "hopper", "blackwell": "blackwell", "rubin": "rubin",
}
# Architectures whose PCI GPUs all share one compute capability.
ARCH_COMPUTE = {"volta": (7, 0), "turing": (7, 5), "ada lovelace": (8, 9), "hopper": (9, 0)}
# NVML's nvmlBrandType_t, spelled as NVIDIA's container toolkit compares `brand=` (lower case).
NVML_BRANDS = ("unknown", "quadro", "tesla", "nvs", "grid", "geforce", "titan", "nvidiavapps", "nvidiavpc",
               "nvidiavcs", "nvidiavws", "nvidiacloudgaming", "quadrortx", "nvidiartx", "nvidia",
               "geforcertx", "titanrtx")
# nvidia-smi's <product_brand> wordings that are not NVML's name without spaces.
SMI_BRANDS = {"nvidia virtual applications": "nvidiavapps", "nvidia virtual pc": "nvidiavpc",
              "nvidia virtual compute server": "nvidiavcs", "nvidia rtx virtual workstation": "nvidiavws",
              "nvidia cloud gaming": "nvidiacloudgaming"}
# Data center product names (NVML brand "Nvidia"): A100, H100, L40S, B200, GH200, ... after "NVIDIA ".
_DATA_CENTER_NAME = re.compile(r"(?:NVIDIA )?(?:[ABHL]|GH|GB)\d+[A-Z]?\b.*")


class GpuSourceUnavailable(Exception):
    """This source cannot say anything on this machine (no library, no driver, no tool)."""


@dataclass(frozen=True)
class MigDevice:
    profile: str | None = None  # e.g. "1g.10gb" (NVML only)
    memory_mib: int | None = None
    attributes: dict[str, int] = field(default_factory=dict)  # GFD suffix -> value


# NVML's nvmlGpuFabricState_t.
FABRIC_STATES = {0: "Not Supported", 1: "Not Started", 2: "In Progress", 3: "Completed"}
FABRIC_COMPLETED = 3


@dataclass(frozen=True)
class Fabric:
    """One GPU's NVLink fabric registration (NVML's nvmlDeviceGetGpuFabricInfo, v1 struct)."""
    state: int  # FABRIC_STATES
    status: int  # an nvmlReturn_t: 0 is success
    clique_id: int
    cluster_uuid: str  # RFC 4122 text, lower case, as Go's uuid.FromBytes(...).String() writes it

    @property
    def attached(self) -> bool:
        """go-nvlib's IsFabricAttached (what GFD's IMEX labeler counts): registration completed,
        status success, a cluster UUID that is not all zeros."""
        return (self.state == FABRIC_COMPLETED and self.status == 0
                and self.cluster_uuid != "00000000-0000-0000-0000-000000000000")


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_mib: int | None = None
    compute: tuple[int, int] | None = None
    architecture: str | None = None  # nvidia-smi wording, e.g. "Ampere", "Ada Lovelace"
    mig_capable: bool | None = None
    mig_enabled: bool = False
    pci_class: int | None = None  # 16-bit class code, e.g. 0x0302
    pci_device: str | None = None  # "10de:2330"
    bus_id: str | None = None  # "0000:1b:00.0"
    mig_devices: tuple[MigDevice, ...] = ()
    brand: str | None = None  # NVML's brand, lower case: "tesla", "nvidia", "geforce", ...
    fabric: Fabric | None = None  # None: no fabric (NVML says not supported) or not known (other sources)
    fabric_error: str | None = None  # NVML failed to say (neither success nor not supported)

    @property
    def family(self) -> str | None:
        if self.compute:
            return arch_family(*self.compute)
        if self.architecture:
            return ARCH_FAMILY.get(self.architecture.strip().lower())
        return None


@dataclass(frozen=True)
class GpuFacts:
    source: str  # nvml | nvidia-smi | pci
    gpus: tuple[Gpu, ...] = ()
    driver_version: str | None = None
    cuda_version: tuple[int, int] | None = None
    notes: tuple[str, ...] = ()


def arch_family(major: int, minor: int) -> str:
    """GFD's getArchFamily (internal/lm/resource.go)."""
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    return {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper",
            10: "blackwell", 12: "blackwell", 13: "rubin"}.get(major, "undefined")


def compute_from_pci(device_id: str | None, architecture: str | None,
                     pci_ids: Path | None) -> tuple[int, int] | None:
    """Compute capability from the chip named in pci.ids, else from an architecture that has only one."""
    if device_id:
        name = pciids.nvidia_devices(pci_ids).get(device_id.lower())
        chip = pciids.chip_of(name) if name else None
        if chip in pciids.CHIP_COMPUTE:
            return pciids.CHIP_COMPUTE[chip]
    if architecture:
        return ARCH_COMPUTE.get(architecture.strip().lower())
    return None


def brand_from_name(name: str | None) -> str | None:
    """The NVML brand a product name implies, for sources that only have the name (PCI ids, the
    driver's supported-gpus.json); None when the name does not say (pure)."""
    text = (name or "").strip()
    low = text.lower()
    rtx = "rtx" in low.split()
    for word, brand in (("geforce", "geforce"), ("titan", "titan"), ("quadro", "quadro"), ("tesla", "tesla"),
                        ("nvs", "nvs"), ("grid", "grid")):
        if word in low.split():
            return f"{brand}rtx" if rtx and brand in ("geforce", "titan", "quadro") else brand
    if rtx:
        return "nvidiartx"
    return "nvidia" if _DATA_CENTER_NAME.fullmatch(text) else None


def brand_from_smi(text: str | None) -> str | None:
    """nvidia-smi's <product_brand> ('NVIDIA RTX', 'Tesla', 'GeForce') as NVML spells it (pure)."""
    low = " ".join((text or "").lower().split())
    return SMI_BRANDS.get(low, low.replace(" ", "")) or None


def driver_loaded(sysfs_root: Path) -> bool:
    return (sysfs_root / "module" / "nvidia").is_dir()


def sysfs_driver_version(sysfs_root: Path, problems: list[str] | None = None) -> str | None:
    """The loaded module's version from <sysfs>/module/nvidia/version (read with nodeprep.sysfs:
    unsafe or undecodable content is None plus a line in `problems`)."""
    text = read_attr(sysfs_root / "module" / "nvidia" / "version", problems)
    return (text or "").strip() or None


def _pci_class_of(sysfs_root: Path, bus_id: str | None) -> int | None:
    if not bus_id:
        return None
    value = PciDevice(devices_dir(sysfs_root) / bus_id).hex("class")
    return value >> 8 if value is not None else None


def normalise_bus_id(bus_id: str) -> str:
    """nvidia-smi/NVML '00000000:01:00.0' -> sysfs '0000:01:00.0'."""
    bus_id = bus_id.strip().lower()
    domain, _, rest = bus_id.partition(":")
    if rest and len(domain) > 4:
        domain = domain[-4:]
    return f"{domain}:{rest}" if rest else bus_id


# --- NVML ------------------------------------------------------------------------------------------

@contextmanager
def nvml_session(unavailable: Callable[[str], Exception] = GpuSourceUnavailable) -> Iterator[Any]:
    """The one way into NVML: the nvidia-ml-py module (imported here so nodeprep works without it)
    initialised, shut down when the block ends; `unavailable(why)` raised when it cannot be
    (not installed, init fails)."""
    try:
        # lazy: labels --help, Ansible nodeprep_driver, Ansible nodeprep_join and 6 more starts
        import pynvml
    except ImportError:
        raise unavailable("nvidia-ml-py is not installed") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise unavailable(f"NVML init failed: {e}") from None
    try:
        yield pynvml
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def from_nvml(sysfs_root: Path, driver_sysfs: Path | None = None) -> GpuFacts:
    """Ask NVML; only when the driver is loaded (`driver_sysfs`, default `sysfs_root`, says so)."""
    loaded_in = driver_sysfs or sysfs_root
    if not driver_loaded(loaded_in):
        raise GpuSourceUnavailable(f"NVIDIA kernel module not loaded ({loaded_in}/module/nvidia absent)")
    with nvml_session() as nv:
        driver = _s(nv.nvmlSystemGetDriverVersion())
        cuda_int = nv.nvmlSystemGetCudaDriverVersion()
        cuda = (cuda_int // 1000, (cuda_int % 1000) // 10)
        gpus = [_nvml_gpu(nv, nv.nvmlDeviceGetHandleByIndex(i), sysfs_root)
                for i in range(nv.nvmlDeviceGetCount())]
    return GpuFacts("nvml", tuple(gpus), driver, cuda)


def _s(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _nvml_gpu(nv: Any, handle: Any, sysfs_root: Path) -> Gpu:  # nv: pynvml, untyped
    def opt(fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except nv.NVMLError:
            return None

    name = _s(nv.nvmlDeviceGetName(handle))
    mem = opt(nv.nvmlDeviceGetMemoryInfo, handle)
    cc = opt(nv.nvmlDeviceGetCudaComputeCapability, handle)
    mig = opt(nv.nvmlDeviceGetMigMode, handle)
    pci = opt(nv.nvmlDeviceGetPciInfo, handle)
    brand = opt(nv.nvmlDeviceGetBrand, handle) if hasattr(nv, "nvmlDeviceGetBrand") else None  # nvml 3xx+
    bus_id = normalise_bus_id(_s(pci.busId)) if pci is not None else None
    pci_device = nvidia_pci_id(pci.pciDeviceId >> 16) if pci is not None else None
    mig_enabled = bool(mig and mig[0] == nv.NVML_DEVICE_MIG_ENABLE)
    fabric, fabric_error = _nvml_fabric(nv, handle)
    migs: list[MigDevice] = []
    if mig_enabled:
        for i in range(opt(nv.nvmlDeviceGetMaxMigDeviceCount, handle) or 0):
            mh = opt(nv.nvmlDeviceGetMigDeviceHandleByIndex, handle, i)
            if mh is None:
                continue
            mname = _s(opt(nv.nvmlDeviceGetName, mh) or "")
            attrs = opt(nv.nvmlDeviceGetAttributes_v2, mh)
            migs.append(MigDevice(
                profile=mname.split(" MIG ", 1)[1].strip() if " MIG " in mname else None,
                memory_mib=getattr(attrs, "memorySizeMB", None),
                attributes=_mig_attributes(attrs) if attrs is not None else {},
            ))
    return Gpu(
        name=name,
        memory_mib=mem.total // (1024 * 1024) if mem is not None else None,
        compute=tuple(cc) if cc and cc[0] else None,
        mig_capable=mig is not None,
        mig_enabled=mig_enabled,
        pci_class=_pci_class_of(sysfs_root, bus_id),
        pci_device=pci_device,
        bus_id=bus_id,
        mig_devices=tuple(migs),
        brand=NVML_BRANDS[brand] if isinstance(brand, int) and 0 < brand < len(NVML_BRANDS) else None,
        fabric=fabric,
        fabric_error=fabric_error,
    )


def uuid_text(raw: bytes) -> str:
    """16 bytes as RFC 4122 text: 8-4-4-4-12 lower-case hex digits (pure)."""
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _nvml_fabric(nv: Any, handle: Any) -> tuple[Fabric | None, str | None]:
    """(fabric, None), (None, None) when NVML has no fabric for this GPU (not supported, or a library
    without the call), or (None, why) when the call failed otherwise."""
    if not hasattr(nv, "nvmlDeviceGetGpuFabricInfo") or not hasattr(nv, "c_nvmlGpuFabricInfo_t"):
        return None, None
    info = nv.c_nvmlGpuFabricInfo_t()
    try:
        nv.nvmlDeviceGetGpuFabricInfo(handle, nv.byref(info))
    except nv.NVMLError as e:
        if getattr(e, "value", None) in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_FUNCTION_NOT_FOUND):
            return None, None
        return None, f"nvmlDeviceGetGpuFabricInfo: {e}"
    return Fabric(state=int(info.state), status=int(info.status), clique_id=int(info.cliqueId),
                  cluster_uuid=uuid_text(bytes(info.clusterUuid))), None


def _mig_attributes(attrs: Any) -> dict[str, int]:  # an NVML c_nvmlDeviceAttributes_t
    fields = {
        "multiprocessors": "multiprocessorCount", "slices.gi": "gpuInstanceSliceCount",
        "slices.ci": "computeInstanceSliceCount", "engines.copy": "sharedCopyEngineCount",
        "engines.decoder": "sharedDecoderCount", "engines.encoder": "sharedEncoderCount",
        "engines.jpeg": "sharedJpegCount", "engines.ofa": "sharedOfaCount",
    }
    return {k: int(getattr(attrs, v)) for k, v in fields.items() if hasattr(attrs, v)}


# --- nvidia-smi -q -x ------------------------------------------------------------------------------

DRIVER_NVIDIA_SMI = Path("/opt/nvidia/current/bin/nvidia-smi")  # the running system's active driver root


def find_nvidia_smi(root: Path) -> Path | None:
    """This host's nvidia-smi: the one on PATH, else (only when `root` is the running system) the
    active driver root's. Never one under an image's root: it is the image's program (#35)."""
    found = runner.which("nvidia-smi")
    if found:
        return Path(found)
    if os.path.realpath(root) != "/":
        return None
    ours = DRIVER_NVIDIA_SMI
    return ours if ours.is_file() and os.access(ours, os.X_OK) else None


def from_nvidia_smi(root: Path, sysfs_root: Path, timeout: float, pci_ids: Path | None = None,
                    driver_sysfs: Path | None = None) -> GpuFacts:
    """Run this host's `nvidia-smi -q -x` (only when the driver is loaded: `driver_sysfs`, default
    `sysfs_root`, says so) and parse it."""
    if not driver_loaded(driver_sysfs or sysfs_root):
        raise GpuSourceUnavailable("NVIDIA kernel module not loaded")
    tool = find_nvidia_smi(root)
    if tool is None:
        raise GpuSourceUnavailable("nvidia-smi not found" if os.path.realpath(root) == "/" else
                                   "this host has no nvidia-smi on PATH (the one under --root is never run)")
    env = {}
    if tool == DRIVER_NVIDIA_SMI:
        env["LD_LIBRARY_PATH"] = str(tool.parent.parent / "lib64")
    result = runner.run([tool, "-q", "-x"], timeout=timeout, env=env)
    return parse_nvidia_smi_xml(result.stdout, sysfs_root=sysfs_root, pci_ids=pci_ids)


def _text(el: ET.Element | None, path: str) -> str | None:
    if el is None:
        return None
    found = el.find(path)
    if found is None or found.text is None:
        return None
    text = found.text.strip()
    return None if text in ("", "N/A") else text


def _mib(text: str | None) -> int | None:
    if not text:
        return None
    number, _, unit = text.partition(" ")
    try:
        value = int(number)
    except ValueError:
        return None
    return {"MiB": value, "GiB": value * 1024, "KiB": value // 1024}.get(unit.strip() or "MiB", value)


def parse_nvidia_smi_xml(text: str | bytes, *, sysfs_root: Path | None = None,
                         pci_ids: Path | None = None) -> GpuFacts:
    """GpuFacts from `nvidia-smi -q -x` output (DTD v10-v13). The external DTD is never fetched."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise ValueError(f"not nvidia-smi XML: {e}") from None
    if root.tag != "nvidia_smi_log":
        raise ValueError(f"not nvidia-smi XML: root element is <{root.tag}>")
    gpus = []
    for g in root.findall("gpu"):
        dev_id = (_text(g, "pci/pci_device_id") or "").lower()
        nvidia = len(dev_id) == 8 and dev_id[4:] == NVIDIA_VENDOR_ID
        device = dev_id[:4] if nvidia and dev_id[:4] != "0000" else None
        arch = _text(g, "product_architecture")
        current_mig = _text(g, "mig_mode/current_mig")
        bus_id = normalise_bus_id(g.get("id") or _text(g, "pci/pci_bus_id") or "") or None
        migs = tuple(
            MigDevice(memory_mib=_mib(_text(m, "fb_memory_usage/total")),
                      attributes=_xml_mig_attributes(m))
            for m in g.findall("mig_devices/mig_device")
        )
        gpus.append(Gpu(
            name=_text(g, "product_name") or "",
            memory_mib=_mib(_text(g, "fb_memory_usage/total")),
            compute=compute_from_pci(device, arch, pci_ids),
            architecture=arch,
            mig_capable=current_mig is not None,
            mig_enabled=current_mig == "Enabled",
            pci_class=_pci_class_of(sysfs_root, bus_id) if sysfs_root else None,
            pci_device=f"{NVIDIA_VENDOR_ID}:{device}" if device else None,
            bus_id=bus_id,
            mig_devices=migs if current_mig == "Enabled" else (),
            brand=brand_from_smi(_text(g, "product_brand")),
        ))
    notes = []
    attached = _text(root, "attached_gpus")
    if attached and attached.isdigit() and int(attached) != len(gpus):
        notes.append(f"nvidia-smi reports {attached} attached GPUs but lists {len(gpus)}; "
                     f"labels count the {len(gpus)} listed")
    cuda = _text(root, "cuda_version")
    return GpuFacts("nvidia-smi", tuple(gpus), _text(root, "driver_version"), _version_pair(cuda),
                    tuple(notes))


def _xml_mig_attributes(m: ET.Element) -> dict[str, int]:
    fields = {"multiprocessors": "multiprocessor_count", "engines.copy": "copy_engine_count",
              "engines.decoder": "decoder_count", "engines.encoder": "encoder_count",
              "engines.jpeg": "jpg_count", "engines.ofa": "ofa_count"}
    out = {}
    for key, tag in fields.items():
        value = _text(m, f"device_attributes/shared/{tag}")
        if value and value.isdigit():
            out[key] = int(value)
    return out


def _version_pair(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    parts = text.split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


def from_nvidia_smi_file(path: Path, sysfs_root: Path | None = None, pci_ids: Path | None = None) -> GpuFacts:
    return parse_nvidia_smi_xml(path.read_bytes(), sysfs_root=sysfs_root, pci_ids=pci_ids)


# --- PCI sysfs -------------------------------------------------------------------------------------

def from_sysfs(sysfs_root: Path, pci_ids: Path | None = None) -> GpuFacts:
    """NVIDIA display/3D controllers under <sysfs>/bus/pci/devices (NVSwitch bridges are skipped)."""
    folder = devices_dir(sysfs_root)
    if not folder.is_dir():
        raise GpuSourceUnavailable(f"{folder} does not exist")
    names = pciids.nvidia_devices(pci_ids)
    gpus = []
    problems: list[str] = []
    for pci in nvidia_gpus(sysfs_root, problems):
        dev = pci.path
        cls = pci.hex("class")
        assert cls is not None  # nvidia_gpus read it
        device_id = pci.hex("device", problems)
        did = f"{device_id:04x}" if device_id is not None else None
        pci_name = names.get(did or "")
        chip = pciids.chip_of(pci_name) if pci_name else None
        name = pciids.marketing_name(pci_name) if pci_name else None
        gpus.append(Gpu(
            name=name or f"NVIDIA Device {did or 'unknown'}",
            compute=pciids.CHIP_COMPUTE.get(chip or ""),
            mig_capable=(chip in MIG_CAPABLE_CHIPS) if chip else None,
            pci_class=cls >> 8,
            pci_device=f"{NVIDIA_VENDOR_ID}:{did}" if did else None,
            bus_id=dev.name,
            brand=brand_from_name(name),
        ))
    version = sysfs_driver_version(sysfs_root, problems)
    notes = ([] if names else ["no pci.ids database found: GPU names are PCI ids"]) + problems
    return GpuFacts("pci", tuple(gpus), version, None, tuple(notes))
