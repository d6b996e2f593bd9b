"""GPUDirect on a node: which companion modules load, in what order, and whether nvidia-peermem can.

Pure decisions over explicit facts; devices.load_modules applies them on the live system.

- which load: the profile's `driver.modules` plus its `driver.gpudirect` choices, each after nvidia
  (nvidia-fs, gdrdrv and nvidia-peermem bind to nvidia.ko's nvidia_p2p_* exports): profile.model's
  `Driver.load_order`.
- `peermem`: nvidia-peermem registers itself with the InfiniBand stack's peer-memory API
  (`ib_register_peer_memory_client`), which MLNX_OFED's ib_core exports and the kernel's inbox
  ib_core does not; loaded only where that symbol is exported (in /proc/kallsyms of the running
  kernel or in the Module.symvers of the node's ib_core build). Elsewhere GPUDirect RDMA goes through
  DMA-BUF (the open kernel modules on a 6.x kernel), and the decision says so in one line.
- `/dev/gdrdrv`: gdrdrv registers a character major (`/proc/devices`: `NNN gdrdrv`) and makes no
  node; devices.device_nodes makes it (minor 0), as it makes /dev/nvidia*.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PEER_MEMORY_SYMBOL = "ib_register_peer_memory_client"
# where MLNX_OFED installs the Module.symvers of its kernel modules (ib_core among them)
OFED_SYMVERS = ("usr/src/ofa_kernel/default/Module.symvers",)


def exports_peer_memory(kallsyms: str | None, ib_core_symvers: str | None) -> bool:
    """Whether the InfiniBand stack exports the peer-memory API: the symbol in /proc/kallsyms
    (`ADDR T ib_register_peer_memory_client [ib_core]`) or in ib_core's Module.symvers."""
    pattern = re.compile(rf"(^|\s){PEER_MEMORY_SYMBOL}(\s|$)", re.M)
    return any(text and pattern.search(text) for text in (kallsyms, ib_core_symvers))


@dataclass(frozen=True)
class PeermemDecision:
    load: bool
    line: str  # what the node says about it, one line


def peermem(kallsyms: str | None, ib_core_symvers: str | None, *, flavour: str | None,
            kernel_release: str) -> PeermemDecision:
    """Load nvidia-peermem only where the peer-memory API is exported; else say DMA-BUF is the path."""
    if exports_peer_memory(kallsyms, ib_core_symvers):
        return PeermemDecision(True, f"nvidia-peermem: the InfiniBand stack exports {PEER_MEMORY_SYMBOL}: "
                                     "loading it (GPUDirect RDMA through peer memory)")
    major = int(m[1]) if (m := re.match(r"(\d+)\.", kernel_release)) else 0
    why = (f"nvidia-peermem not loaded: the InfiniBand stack exports no {PEER_MEMORY_SYMBOL} "
           "(inbox RDMA, no MLNX_OFED)")
    if flavour == "open" and major >= 6:
        return PeermemDecision(False, f"{why}; GPUDirect RDMA goes through DMA-BUF (open modules, kernel "
                                      f"{kernel_release})")
    have = f"{flavour or 'unknown'} modules on kernel {kernel_release}"
    return PeermemDecision(False, f"{why}; DMA-BUF is the path, and it needs the open modules on a kernel "
                                  f">= 6.x ({have})")
