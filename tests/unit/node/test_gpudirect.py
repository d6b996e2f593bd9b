"""GPUDirect on the node: /dev/gdrdrv from gdrdrv's major, nvidia-peermem only where the InfiniBand
stack exports the peer-memory API (else one line naming DMA-BUF), the profile's driver.gpudirect
and the order it loads in.

Nothing GPU-like is used. /proc/devices follows the kernel's format (fs/char_dev.c, "%3d %s\\n")
with the name gdrdrv registers (gdrdrv.c: register_chrdev(0, "gdrdrv", ...)); the inbox ib_core
is the real Module.symvers of the test cache's Debian kernel (skipped without it); the MLNX_OFED
lines are written in the formats /proc/kallsyms and Module.symvers use (no MLNX_OFED node here)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from nodeprep.errors import ProfileError
from nodeprep.node.devices import DeviceNode, device_nodes, make_nodes, parse_proc_devices
from nodeprep.node.gpudirect import PEER_MEMORY_SYMBOL, exports_peer_memory, peermem
from nodeprep.profile import parse_profile

PROC_DEVICES = """Character devices:
  1 mem
195 nvidia-frontend
234 nvidia-uvm
235 nvidia-caps
509 gdrdrv
510 nvidia-fs

Block devices:
  7 loop
"""
KALLSYMS_OFED = (
    "ffffffffc0a0e2c0 t ib_peer_mem_release\t[ib_core]\n"
    f"ffffffffc0a0f110 T {PEER_MEMORY_SYMBOL}\t[ib_core]\n"
    "ffffffffc0a0f3a0 T ib_unregister_peer_memory_client\t[ib_core]\n"
)
SYMVERS_OFED = f"0x8e2a0a3c\t{PEER_MEMORY_SYMBOL}\tdrivers/infiniband/core/ib_core\tEXPORT_SYMBOL\t\n"


def test_gdrdrv_gets_its_node_from_its_major() -> None:
    majors = parse_proc_devices(PROC_DEVICES)
    nodes = device_nodes(majors, [0], ("nvidia", "nvidia-uvm", "gdrdrv"))
    assert DeviceNode("/dev/gdrdrv", 509, 0) in nodes
    assert nodes[-1] == DeviceNode("/dev/gdrdrv", 509, 0)
    assert "/dev/gdrdrv" not in [n.path for n in device_nodes(majors, [0], ("nvidia",))]
    # gdrdrv asked for but not loaded (no major): no node
    assert "/dev/gdrdrv" not in [n.path for n in device_nodes({"nvidia": 195}, [0], ("nvidia", "gdrdrv"))]


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_the_gdrdrv_node_is_made_and_replaced_when_its_major_moves(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    assert make_nodes(tmp_path, [DeviceNode("/dev/gdrdrv", 509, 0)]) == ["/dev/gdrdrv"]
    st = (tmp_path / "dev" / "gdrdrv").lstat()
    assert stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == 509 and stat.S_IMODE(st.st_mode) == 0o666
    assert make_nodes(tmp_path, [DeviceNode("/dev/gdrdrv", 509, 0)]) == []  # already right
    assert make_nodes(tmp_path, [DeviceNode("/dev/gdrdrv", 508, 0)]) == ["/dev/gdrdrv"]  # a new boot's major
    assert os.major((tmp_path / "dev" / "gdrdrv").lstat().st_rdev) == 508


def test_peermem_loads_where_the_peer_memory_api_is_exported() -> None:
    for kallsyms, symvers in ((KALLSYMS_OFED, None), (None, SYMVERS_OFED), (KALLSYMS_OFED, SYMVERS_OFED)):
        decision = peermem(kallsyms, symvers, flavour="proprietary", kernel_release="6.1.0-57-amd64")
        assert decision.load and PEER_MEMORY_SYMBOL in decision.line
    # another symbol that merely contains the name does not count
    assert not exports_peer_memory(f"ffffffffc0a0f110 T x{PEER_MEMORY_SYMBOL}_v2\t[foo]\n", None)


def test_without_it_one_line_says_dma_buf_is_the_path(test_cache: Path) -> None:
    inbox = sorted((test_cache / "kernels").glob("*/Module.symvers"))
    if not inbox:
        pytest.skip("no kernels in the test cache (the slow smoke tier fetches them)")
    symvers = inbox[0].read_text()
    assert "\tib_register_client\t" in symvers  # the inbox ib_core is there ...
    assert not exports_peer_memory(None, symvers)  # ... without the peer-memory API
    kallsyms = "ffffffffc0a01000 T ib_register_client\t[ib_core]\n"
    open_6 = peermem(kallsyms, symvers, flavour="open", kernel_release="6.1.0-57-amd64")
    assert not open_6.load and "\n" not in open_6.line
    assert open_6.line == (
        f"nvidia-peermem not loaded: the InfiniBand stack exports no {PEER_MEMORY_SYMBOL} (inbox RDMA, no "
        "MLNX_OFED); GPUDirect RDMA goes through DMA-BUF (open modules, kernel 6.1.0-57-amd64)")
    proprietary = peermem(kallsyms, None, flavour="proprietary", kernel_release="6.1.0-57-amd64")
    assert not proprietary.load
    assert proprietary.line.endswith("DMA-BUF is the path, and it needs the open modules on a kernel >= 6.x "
                                     "(proprietary modules on kernel 6.1.0-57-amd64)")
    old = peermem(None, None, flavour="open", kernel_release="5.10.0-30-amd64")
    assert not old.load and "needs the open modules on a kernel >= 6.x" in old.line


def _driver(**driver: object):  # type: ignore[no-untyped-def]
    return parse_profile({"driver": {"version": "535.309.01", **driver}}).driver


def test_the_profile_chooses_the_gpudirect_modules_default_none() -> None:
    assert _driver().gpudirect == () and _driver().load_order == ("nvidia", "nvidia-uvm", "nvidia-modeset")
    d = _driver(gpudirect=["gdrdrv", "nvidia-fs", "nvidia-peermem"])
    assert d.load_order == ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-peermem", "nvidia-fs", "gdrdrv")
    d = _driver(modules=["nvidia", "gdrdrv"], gpudirect=["gdrdrv"])
    assert d.load_order == ("nvidia", "gdrdrv")
    with pytest.raises(ProfileError, match="driver.gpudirect"):
        _driver(gpudirect=["nvidia-peer-mem"])


def test_install_commands_take_the_profiles_load_order_unless_modules_is_given(tmp_path: Path) -> None:
    from nodeprep.commands.install import _driver

    prof = tmp_path / "node.yaml"
    prof.write_text("driver:\n  version: 535.309.01\n  modules: [nvidia, nvidia-uvm]\n"
                    "  gpudirect: [gdrdrv, nvidia-fs]\n")
    got = _driver(tmp_path, prof, {"driver.modules": None}).load_order
    assert got == ("nvidia", "nvidia-uvm", "nvidia-fs", "gdrdrv")
    assert _driver(tmp_path, prof, {"driver.modules": "nvidia,gdrdrv"}).load_order == ("nvidia", "gdrdrv")
