"""The GPU self-test a node passes before it may take GPU work (`nodeprep verify-gpus`).

Checks, each one line when it fails:
- module:      the loaded kernel module's version (/sys/module/nvidia/version) is the active driver
               root's (/opt/nvidia/current -> <version>), and nvidia-smi reports that version too;
- visibility:  every NVIDIA display/3D controller on the PCI bus (vendor 0x10de, class 0x0300/0x0302)
               is listed by the driver (nvidia-smi), and the driver lists no GPU the bus lacks;
- memory:      no GPU has a pending row remap or a row-remap failure, and none has pages pending
               retirement (retired-page overflow / pending blacklist);
- persistence: every GPU's persistence mode is what `driver.persistence_mode` asks (unless `any`).

`gather()` reads the node (sysfs, the driver root, `nvidia-smi -q -x` from the active root, or a
capture given with `nvidia_smi_xml`); `evaluate()` is the pure verdict over those facts.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from .. import runner
from ..errors import InputError
from ..labels.gpu import find_nvidia_smi, normalise_bus_id, sysfs_driver_version
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


@dataclass(frozen=True)
class SelfTestFacts:
    active_version: str | None
    loaded_version: str | None
    smi_driver_version: str | None
    pci_gpus: tuple[str, ...]  # sysfs bus ids
    gpus: tuple[GpuHealth, ...]
    persistence_mode: str = "any"


@dataclass(frozen=True)
class Verdict:
    passed: bool
    problems: tuple[str, ...] = ()
    checked: tuple[str, ...] = field(default=("module", "visibility", "memory", "persistence"))
    driver_version: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {"passed": self.passed, "problems": list(self.problems), "checked": list(self.checked),
                "driver_version": self.driver_version}


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
        ))
    return _text(root, "driver_version"), tuple(gpus)


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
        if g.remap_pending:
            problems.append(f"memory: GPU {g.bus_id} has a pending row remap (reset the GPU)")
        if g.remap_failure:
            problems.append(f"memory: GPU {g.bus_id} had a row-remap failure (replace the GPU)")
        if g.retirement_pending:
            problems.append(f"memory: GPU {g.bus_id} has pages pending retirement (reset the GPU)")
        if f.persistence_mode != "any" and g.persistence is not None:
            want = f.persistence_mode == "enabled"
            if g.persistence != want:
                problems.append(f"persistence: GPU {g.bus_id} has persistence mode "
                                f"{'enabled' if g.persistence else 'disabled'}, the profile asks for "
                                f"{f.persistence_mode}")
    return Verdict(not problems, tuple(problems), driver_version=f.active_version)


def gather(root: Path, sysfs_root: Path, *, persistence_mode: str = "any", nvidia_smi_xml: Path | None = None,
           timeout: float = 30.0) -> SelfTestFacts:
    """Read the node. GPU facts from `nvidia_smi_xml` when given (a capture), else from running the
    active root's nvidia-smi (only when the module is loaded)."""
    loaded = sysfs_driver_version(sysfs_root)
    xml: str | bytes | None = None
    if nvidia_smi_xml is not None:
        xml = nvidia_smi_xml.read_bytes()
    elif loaded is not None and (tool := find_nvidia_smi(root)) is not None:
        env = {}
        if str(tool).startswith(str(root / "opt/nvidia")):
            env["LD_LIBRARY_PATH"] = str(tool.parent.parent / "lib64")
        xml = runner.run([tool, "-q", "-x"], timeout=timeout, env=env).stdout
    smi_version, gpus = parse_health(xml) if xml is not None else (None, ())
    return SelfTestFacts(active_version=active_version(Layout(root)), loaded_version=loaded,
                         smi_driver_version=smi_version, pci_gpus=pci_nvidia_gpus(sysfs_root), gpus=gpus,
                         persistence_mode=persistence_mode)
