"""The GPU self-test a node passes before it may take GPU work (`nodeprep verify-gpus`).

Checks, each one line when it fails:
- module:      the loaded kernel module's version (/sys/module/nvidia/version) is the active driver
               root's (/opt/nvidia/current -> <version>), and nvidia-smi reports that version too;
- visibility:  every NVIDIA display/3D controller on the PCI bus (vendor 0x10de, class 0x0300/0x0302)
               is listed by the driver (nvidia-smi), the driver lists no GPU the bus lacks, and NVML
               calls no GPU lost (NVML_ERROR_GPU_IS_LOST);
- memory:      no GPU has a pending row remap or a row-remap failure, and none has pages pending
               retirement (retired-page overflow / pending blacklist);
- persistence: every GPU's persistence mode is what `driver.persistence_mode` asks (unless `any`);
- fabric:      every GPU on an NVLink fabric (NVML's GpuFabricInfo answers) has the fabric state
               COMPLETED and a successful status: Fabric Manager has registered it (until then CUDA
               fails to initialise with error 802); the self-test waits for it up to a timeout.

`gather()` reads the node: sysfs, the driver root, and the GPUs from NVML (nvidia-ml-py over the
host's libnvidia-ml: `nvmlDeviceGetPersistenceMode`, the remapped rows, the retired pages; only with
the module loaded), else `nvidia-smi -q -x` from this host, or a capture given with `nvidia_smi_xml`;
`evaluate()` is the pure verdict over those facts.
"""

from __future__ import annotations

import ctypes
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import runner
from ..errors import InputError
from ..labels.gpu import (
    GpuSourceUnavailable,
    find_nvidia_smi,
    normalise_bus_id,
    nvml_session,
    sysfs_driver_version,
)
from ..pci import nvidia_gpus
from .layout import Layout
from .state import active_version

PERSISTENCE = ("any", "enabled", "disabled")


@dataclass(frozen=True)
class GpuHealth:
    """What nvidia-smi says about one GPU (None: not reported, e.g. N/A on this GPU)."""

    bus_id: str
    name: str = ""
    persistence: bool | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    retirement_pending: bool | None = None
    fabric_state: str | None = None  # NVML's GpuFabricInfo state, as nvidia-smi names it; None: no fabric
    fabric_status: int = 0  # NVML's return code of the fabric's registration (0: success)
    lost: bool = False  # a query answered NVML_ERROR_GPU_IS_LOST (fallen off the bus, needs a reset)


@dataclass(frozen=True)
class SelfTestFacts:
    active_version: str | None
    loaded_version: str | None
    smi_driver_version: str | None
    pci_gpus: tuple[str, ...]  # sysfs bus ids
    gpus: tuple[GpuHealth, ...]
    persistence_mode: str = "any"
    source: str = "nvidia-smi"  # where `gpus` came from: nvml, nvidia-smi or a capture


@dataclass(frozen=True)
class Verdict:
    passed: bool
    problems: tuple[str, ...] = ()
    checked: tuple[str, ...] = field(default=("module", "visibility", "memory", "persistence", "fabric"))
    driver_version: str | None = None

    gpus: tuple[GpuHealth, ...] = ()
    source: str = ""

    def to_dict(self) -> dict[str, object]:
        return {"passed": self.passed, "problems": list(self.problems), "checked": list(self.checked),
                "driver_version": self.driver_version, "source": self.source,
                "gpus": [{"bus_id": g.bus_id, "name": g.name,
                          "persistence": None if g.persistence is None else
                          ("enabled" if g.persistence else "disabled"),
                          "fabric": g.fabric_state} for g in self.gpus]}


def _yes_no(text: str | None) -> bool | None:
    if text is None:
        return None
    low = text.strip().lower()
    return {"yes": True, "no": False, "enabled": True, "disabled": False}.get(low)


def _text(el: ET.Element, path: str) -> str | None:
    found = el.find(path)
    if found is None or found.text is None:
        return None
    text = found.text.strip()
    return None if text in ("", "N/A") else text


def parse_health(xml: str | bytes) -> tuple[str | None, tuple[GpuHealth, ...]]:
    """(driver version, per-GPU health) from `nvidia-smi -q -x` output."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as e:
        raise InputError(f"not nvidia-smi XML: {e}") from None
    gpus = []
    for g in root.findall("gpu"):
        bus = normalise_bus_id(g.get("id") or _text(g, "pci/pci_bus_id") or "")
        retire = [_yes_no(_text(g, p)) for p in ("retired_pages/pending_retirement",
                                                  "retired_pages/pending_blacklist")]
        gpus.append(GpuHealth(
            bus_id=bus,
            name=_text(g, "product_name") or "",
            persistence=_yes_no(_text(g, "persistence_mode")),
            remap_pending=_yes_no(_text(g, "remapped_rows/remapped_row_pending")),
            remap_failure=_yes_no(_text(g, "remapped_rows/remapped_row_failure")),
            retirement_pending=True if True in retire else (False if False in retire else None),
            fabric_state=_fabric_state(_text(g, "fabric/state")),
            fabric_status=0 if _text(g, "fabric/status") in (None, "Success") else -1,
        ))
    return _text(root, "driver_version"), tuple(gpus)


def _fabric_state(text: str | None) -> str | None:
    """nvidia-smi's <fabric><state> as NVML's state names (None: N/A or Not Supported: no fabric)."""
    return text if text in FABRIC_STATES.values() else None


def pci_nvidia_gpus(sysfs_root: Path) -> tuple[str, ...]:
    """Bus ids of the NVIDIA display/3D controllers in sysfs, sorted."""
    return tuple(d.bus_id.lower() for d in nvidia_gpus(sysfs_root))


def evaluate(f: SelfTestFacts) -> Verdict:
    """The verdict over gathered facts (pure)."""
    problems: list[str] = []
    if f.active_version is None:
        problems.append("module: no active driver version (/opt/nvidia/current)")
    elif f.loaded_version is None:
        problems.append("module: the nvidia kernel module is not loaded")
    elif f.loaded_version != f.active_version:
        problems.append(f"module: loaded nvidia module is {f.loaded_version}, the active driver is "
                        f"{f.active_version} (reboot or reload the modules)")
    if f.smi_driver_version and f.loaded_version and f.smi_driver_version != f.loaded_version:
        problems.append(f"module: nvidia-smi reports driver {f.smi_driver_version}, the loaded module is "
                        f"{f.loaded_version}")
    seen = {g.bus_id for g in f.gpus}
    if not f.pci_gpus:
        problems.append("visibility: no NVIDIA GPU on the PCI bus")
    for bus in f.pci_gpus:
        if bus not in seen:
            problems.append(f"visibility: GPU {bus} is on the PCI bus but not visible to the driver")
    for bus in sorted(seen - set(f.pci_gpus)):
        problems.append(f"visibility: the driver lists GPU {bus}, which is not on the PCI bus")
    for g in f.gpus:
        if g.lost:
            problems.append(f"visibility: GPU {g.bus_id} is lost (NVML: GPU is lost; reset or replace it)")
        if g.remap_pending:
            problems.append(f"memory: GPU {g.bus_id} has a pending row remap (reset the GPU)")
        if g.remap_failure:
            problems.append(f"memory: GPU {g.bus_id} had a row-remap failure (replace the GPU)")
        if g.retirement_pending:
            problems.append(f"memory: GPU {g.bus_id} has pages pending retirement (reset the GPU)")
        if g.fabric_state is not None and g.fabric_state != FABRIC_COMPLETED:
            problems.append(f"fabric: GPU {g.bus_id} fabric state {g.fabric_state} (Fabric Manager has not "
                            "registered it; CUDA fails with error 802 until it has)")
        elif g.fabric_state is not None and g.fabric_status != 0:
            code = "" if g.fabric_status < 0 else f" {g.fabric_status}"
            problems.append(f"fabric: GPU {g.bus_id} fabric state {g.fabric_state} with a failed "
                            f"status{code} (see the Fabric Manager log)")
        if f.persistence_mode != "any" and g.persistence is not None:
            want = f.persistence_mode == "enabled"
            if g.persistence != want:
                problems.append(f"persistence: GPU {g.bus_id} has persistence mode "
                                f"{'enabled' if g.persistence else 'disabled'}, the profile asks for "
                                f"{f.persistence_mode}")
    return Verdict(not problems, tuple(problems), driver_version=f.active_version, gpus=f.gpus,
                   source=f.source)


# NVML's nvmlGpuFabricState_t (0: NOT_SUPPORTED), named as nvidia-smi -q -d FABRIC names them
FABRIC_STATES = {1: "Not Started", 2: "In Progress", 3: "Completed"}
FABRIC_COMPLETED = "Completed"
FABRIC_PENDING = ("Not Started", "In Progress")


def fabric_pending(gpus: tuple[GpuHealth, ...]) -> bool:
    """Whether some GPU's fabric registration is still under way (worth waiting for)."""
    return any(g.fabric_state in FABRIC_PENDING for g in gpus)


def read_nvml() -> tuple[str | None, tuple[GpuHealth, ...]] | None:
    """(driver version, per-GPU health) from NVML, None when NVML cannot be used here (no nvidia-ml-py,
    no libnvidia-ml, init fails). A query a GPU does not support is None in its GpuHealth."""
    try:
        with nvml_session() as nv:
            try:
                return _nvml_health(nv)
            except nv.NVMLError:
                return None
    except GpuSourceUnavailable:
        return None


def _nvml_health(nv: Any) -> tuple[str | None, tuple[GpuHealth, ...]]:  # nv: pynvml, untyped
    lost: set[int] = set()  # indices of GPUs a query called lost

    def opt(fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except nv.NVMLError as e:
            if getattr(e, "value", None) == nv.NVML_ERROR_GPU_IS_LOST:
                lost.add(i)
            return None

    driver = nv.nvmlSystemGetDriverVersion()
    gpus = []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        pci = nv.nvmlDeviceGetPciInfo(h)
        bus = pci.busId.decode() if isinstance(pci.busId, bytes) else str(pci.busId)
        name = nv.nvmlDeviceGetName(h)
        mode = opt(nv.nvmlDeviceGetPersistenceMode, h)
        rows = opt(nv.nvmlDeviceGetRemappedRows, h)  # (corrected, uncorrected, pending, failure)
        pages = opt(nv.nvmlDeviceGetRetiredPagesPendingStatus, h)
        fabric = nv.c_nvmlGpuFabricInfo_t()
        state = None
        if opt(nv.nvmlDeviceGetGpuFabricInfo, h, ctypes.byref(fabric)) is not None:
            state = FABRIC_STATES.get(int(fabric.state))
        gpus.append(GpuHealth(
            bus_id=normalise_bus_id(bus),
            name=name.decode() if isinstance(name, bytes) else str(name),
            persistence=None if mode is None else mode == nv.NVML_FEATURE_ENABLED,
            remap_pending=None if rows is None else bool(rows[2]),
            remap_failure=None if rows is None else bool(rows[3]),
            retirement_pending=None if pages is None else pages == nv.NVML_FEATURE_ENABLED,
            fabric_state=state,
            fabric_status=int(fabric.status) if state else 0,
            lost=i in lost,
        ))
    return (driver.decode() if isinstance(driver, bytes) else str(driver)), tuple(gpus)


NvmlHealth = tuple[str | None, tuple[GpuHealth, ...]]  # (driver version, per-GPU health)


def wait_fabric(read: Callable[[], NvmlHealth | None], timeout: float, *, interval: float = 2.0,
                clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep) -> NvmlHealth | None:
    """`read()` again every `interval` seconds while some GPU's fabric is Not Started or In Progress,
    for at most `timeout` seconds; the last answer (None: NVML could not be read)."""
    deadline = clock() + timeout
    got = read()
    while got is not None and fabric_pending(got[1]) and clock() < deadline:
        sleep(max(0.0, min(interval, deadline - clock())))
        got = read()
    return got


def gather(root: Path, sysfs_root: Path, *, persistence_mode: str = "any", nvidia_smi_xml: Path | None = None,
           timeout: float = 30.0, fabric_timeout: float = 0.0) -> SelfTestFacts:
    """Read the node. GPU facts from `nvidia_smi_xml` when given (a capture), else (only when the module
    is loaded) from NVML, waiting up to `fabric_timeout` seconds for every fabric registration to
    finish, else from running this host's nvidia-smi."""
    loaded = sysfs_driver_version(sysfs_root)
    xml: str | bytes | None = None
    source = "capture" if nvidia_smi_xml is not None else "nvidia-smi"
    if nvidia_smi_xml is not None:
        xml = nvidia_smi_xml.read_bytes()
    elif loaded is not None and (nvml := wait_fabric(read_nvml, fabric_timeout)) is not None:
        return SelfTestFacts(active_version=active_version(Layout(root)), loaded_version=loaded,
                             smi_driver_version=nvml[0], pci_gpus=pci_nvidia_gpus(sysfs_root), gpus=nvml[1],
                             persistence_mode=persistence_mode, source="nvml")
    elif loaded is not None and (tool := find_nvidia_smi(root)) is not None:
        env = {}
        if str(tool).startswith(str(root / "opt/nvidia")):
            env["LD_LIBRARY_PATH"] = str(tool.parent.parent / "lib64")
        argv: list[str | Path] = [tool, "-q", "-x"]
        found = wait_fabric(lambda: parse_health(runner.run(argv, timeout=timeout, env=env).stdout),
                            fabric_timeout)
        assert found is not None
        return SelfTestFacts(active_version=active_version(Layout(root)), loaded_version=loaded,
                             smi_driver_version=found[0], pci_gpus=pci_nvidia_gpus(sysfs_root), gpus=found[1],
                             persistence_mode=persistence_mode, source=source)
    smi_version, gpus = parse_health(xml) if xml is not None else (None, ())
    return SelfTestFacts(active_version=active_version(Layout(root)), loaded_version=loaded,
                         smi_driver_version=smi_version, pci_gpus=pci_nvidia_gpus(sysfs_root), gpus=gpus,
                         persistence_mode=persistence_mode, source=source)
