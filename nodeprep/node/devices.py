"""Loading the modules and creating /dev/nvidia* on a live node (what nodeprep-nvidia.service runs).

Majors come from /proc/devices (`195 nvidia` / `nvidia-frontend`, dynamic `nvidia-uvm`, dynamic
`gdrdrv`); GPU minors from /proc/driver/nvidia/gpus/*/information ("Device Minor:"). Fixed minors:
nvidiactl 255, nvidia-modeset 254; nvidia-uvm 0 and nvidia-uvm-tools 1 on the uvm major; /dev/gdrdrv 0
on gdrdrv's (gdrdrv registers the major and makes no node). nvidia-peermem is loaded only where the
InfiniBand stack exports the peer-memory API (node/gpudirect.py decides; the other case is one line).
"""

from __future__ import annotations

import logging
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from .. import runner
from ..errors import StateError
from ..sysfs import read_attr
from ..vocab import DEFAULT_MODULES
from . import gpudirect

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceNode:
    path: str
    major: int
    minor: int


def parse_proc_devices(text: str) -> dict[str, int]:
    """Character device names -> major from /proc/devices."""
    majors: dict[str, int] = {}
    section = None
    for line in text.splitlines():
        if line.strip().endswith("devices:"):
            section = line.strip().split()[0]
            continue
        parts = line.split()
        if section == "Character" and len(parts) == 2 and parts[0].isdigit():
            majors.setdefault(parts[1], int(parts[0]))
    return majors


def parse_gpu_minors(gpus_dir: Path) -> list[int]:
    minors = []
    if gpus_dir.is_dir():
        for info in sorted(gpus_dir.glob("*/information")):
            m = re.search(r"^Device Minor:\s*(\d+)", read_attr(info, errors="replace") or "", re.M)
            if m:
                minors.append(int(m.group(1)))
    return sorted(minors)


def device_nodes(majors: dict[str, int], gpu_minors: list[int], modules: tuple[str, ...]) -> list[DeviceNode]:
    nodes: list[DeviceNode] = []
    nv = majors.get("nvidia-frontend", majors.get("nvidia"))
    if nv is not None:
        nodes.append(DeviceNode("/dev/nvidiactl", nv, 255))
        nodes += [DeviceNode(f"/dev/nvidia{n}", nv, n) for n in gpu_minors]
        if "nvidia-modeset" in modules:
            nodes.append(DeviceNode("/dev/nvidia-modeset", nv, 254))
    uvm = majors.get("nvidia-uvm")
    if uvm is not None and "nvidia-uvm" in modules:
        nodes += [DeviceNode("/dev/nvidia-uvm", uvm, 0), DeviceNode("/dev/nvidia-uvm-tools", uvm, 1)]
    gdr = majors.get("gdrdrv")
    if gdr is not None and "gdrdrv" in modules:
        nodes.append(DeviceNode("/dev/gdrdrv", gdr, 0))
    return nodes


def make_nodes(root: Path, nodes: list[DeviceNode]) -> list[str]:
    made = []
    for node in nodes:
        path = root / node.path.lstrip("/")
        dev = os.makedev(node.major, node.minor)
        try:
            st = path.lstat()
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == dev:
                continue
            path.unlink()
        except FileNotFoundError:
            pass
        os.mknod(path, 0o666 | stat.S_IFCHR, dev)
        os.chmod(path, 0o666)
        made.append(node.path)
    return made


def peermem_decision(root: Path = Path("/")) -> gpudirect.PeermemDecision:
    """gpudirect.peermem over this system's facts: /proc/kallsyms, MLNX_OFED's ib_core Module.symvers,
    the running kernel and the loaded nvidia module's taint flags (P: proprietary, else open)."""
    kallsyms = read_attr(root / "proc" / "kallsyms", errors="replace", limit=64 << 20)
    symvers = next((t for rel in gpudirect.OFED_SYMVERS
                    if (t := read_attr(root / rel, errors="replace", limit=64 << 20))), None)
    taint = read_attr(root / "sys" / "module" / "nvidia" / "taint", errors="replace")
    flavour = None if taint is None else ("proprietary" if "P" in taint else "open")
    return gpudirect.peermem(kallsyms, symvers, flavour=flavour, kernel_release=os.uname().release)


def load_modules(modules: tuple[str, ...] = DEFAULT_MODULES, *, root: Path = Path("/")) -> list[str]:
    """modprobe each module (in order) and create the device nodes; returns the nodes created.
    nvidia-peermem only where the InfiniBand stack exports the peer-memory API (else one line)."""
    if root.resolve() != Path("/"):
        raise StateError("load-modules only runs on the live system (--root /)")
    for name in modules:
        if name == "nvidia-peermem":
            decision = peermem_decision()
            log.warning("%s", decision.line)
            if not decision.load:
                continue
        runner.run(["modprobe", name], timeout=120)
    majors = parse_proc_devices(read_attr(Path("/proc/devices"), errors="replace") or "")
    nodes = device_nodes(majors, parse_gpu_minors(Path("/proc/driver/nvidia/gpus")), modules)
    return make_nodes(root, nodes)
