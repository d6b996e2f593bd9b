"""The GPU facts file the CUDA gate reads (nodeprep.containerhooks.gate FACTS, /opt/nvidia/gpu-facts.json):
each GPU's NVML brand and compute capability, from the same sources as the labels (NVML, then
nvidia-smi, then PCI sysfs, nodeprep.labels.core). PCI ids say no brand: it comes from the product
name, the active driver's share/supported-gpus.json first, pci.ids second.

Written beneath the root by every activation and by the labels' three front-ends (`nodeprep labels`,
bootstrap's labels step, the collection's nodeprep_labels: all through `record`) on a root with an
active driver; removed by `nodeprep uninstall`, which knows it by its first bytes (MARK). No GPU source at
all (an image root without /sys): nothing is written, a recorded file is left as it is.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..atomicfile import atomic_write, holds
from ..containerhooks.gate import FACTS
from ..errors import InputError
from ..labels.gpu import GpuFacts, brand_from_name
from ..pci import nvidia_pci_id
from ..sysfs import read_bytes
from .layout import Layout, check_version
from .support import SUPPORT_FILE, parse_supported

MARK = '{"nodeprep": "gpu-facts"'  # the first bytes of every facts file nodeprep writes
MAX_SUPPORTED = 8 << 20  # supported-gpus.json of 590: ~1 MiB
MAX_FACTS = 1 << 20  # a recorded facts file: ~100 bytes a GPU
MODE = 0o644  # the gate reads it as whichever user the runtime runs hooks as


def path(layout: Layout) -> Path:
    return layout.opt / Path(FACTS).name


def is_ours(raw: bytes) -> bool:
    return raw.startswith(MARK.encode())


def supported_names(layout: Layout) -> dict[str, str]:
    """'10de:DEVICE' -> product name from the active version's supported-gpus.json, resolved beneath
    the root ({} without one: no active version, no list, or a list that is not NVIDIA's)."""
    try:
        version = check_version(os.readlink(layout.current))
        file = layout.resolved(f"/opt/nvidia/{version}/{SUPPORT_FILE}")
        chips = parse_supported(read_bytes(file, limit=MAX_SUPPORTED).decode(), source=str(file))
    except (OSError, UnicodeError, InputError):  # a bad list only loses the names
        return {}
    out: dict[str, str] = {}
    for c in chips:
        out.setdefault(nvidia_pci_id(c.devid), c.name)
    return out


def render(gpu: GpuFacts, names: Mapping[str, str]) -> str:
    """The facts file for `gpu` (pure): {"nodeprep": "gpu-facts", "source", "gpus": [{"brand",
    "arch", "name", "pci_device"}]}; a brand the source did not say comes from `names` (PCI id ->
    product name), else from the source's own name."""
    gpus = []
    for g in gpu.gpus:
        name = names.get(g.pci_device or "") or g.name
        brand = g.brand or brand_from_name(name) or brand_from_name(g.name)
        gpus.append({"brand": brand, "arch": f"{g.compute[0]}.{g.compute[1]}" if g.compute else None,
                     "name": g.name or name, "pci_device": g.pci_device})
    return json.dumps({"nodeprep": "gpu-facts", "source": gpu.source, "gpus": gpus}) + "\n"


def write(layout: Layout, gpu: GpuFacts) -> bool:
    """Write the facts file for `gpu` (names from the active root's list); True when it changed."""
    return atomic_write(path(layout), render(gpu, supported_names(layout)), mode=MODE)


@dataclass(frozen=True)
class Recording:
    """What recording the facts does on a root: the file (beneath the root), its content, whether
    that differs from what is there (content or mode), and what was there before: the text of the
    regular file at `file` ("" when there was none: absent, a link, not a regular file)."""

    file: Path
    content: str
    changed: bool
    before: str = ""


def _text_at(file: Path) -> str:
    """The text of the regular file at `file`, never through a link; "" when there is none."""
    try:
        return read_bytes(file, limit=MAX_FACTS).decode("utf-8", "replace")
    except OSError:  # absent, a link, a FIFO, a directory, too large: nothing a diff can show
        return ""


def record(root: Path, gpu: GpuFacts | None, *, check: bool = False,
           activating: bool = False) -> Recording | None:
    """The labels' front-ends (`nodeprep labels`, bootstrap, the collection's nodeprep_labels): record
    `gpu` beneath `root` when it has an active driver, `activating` when an earlier step makes one
    active (bootstrap's driver step). None: nothing to record (no GPU facts, no driver). With
    `check`, nothing is written: the answer says what would be (and what is there, `before`)."""
    layout = Layout(Path(root))
    if gpu is None or not (activating or layout.current.is_symlink()):
        return None
    file, content = path(layout), render(gpu, supported_names(layout))
    changed = not holds(file, content.encode(), MODE)
    planned = Recording(file, content, changed, _text_at(file) if changed else content)
    if planned.changed and not check:
        atomic_write(file, content, mode=MODE)
    return planned


def gather(layout: Layout, warnings: list[str], *, timeout: float = 5.0) -> GpuFacts | None:
    """The node's GPU facts as the labels read them: NVML and nvidia-smi only on a live root (under
    a --root they would describe this machine), PCI sysfs under ROOT/sys otherwise."""
    # lazy: Ansible nodeprep_driver, Ansible nodeprep_join, Ansible nodeprep_runtime, Ansible nodeprep_upgrade
    from ..labels.core import LabelOptions, gpu_facts

    opts = LabelOptions(root=layout.root, sysfs_root=layout.root / "sys", use_nvml=layout.live,
                        run_nvidia_smi=layout.live, source_timeout=timeout, total_timeout=timeout * 1.5)
    return gpu_facts(opts, warnings)


def refresh(layout: Layout, notes: list[str]) -> bool:
    """After an activation: record the node's GPU facts (see gather); True when changed.
    Never fails the activation: a problem becomes a line in `notes`."""
    warnings: list[str] = []
    try:
        gpu = gather(layout, warnings)
        if gpu is None:
            return False
        return write(layout, gpu)
    except OSError as e:
        notes.append(f"{FACTS}: GPU facts not written ({e}); the CUDA gate refuses forward compatibility")
        return False
