"""Whether a machine needs Fabric Manager: the pure decision over PCI facts, read from sysfs trees of
an HGX H100 (NVSwitch bridges), an HGX B200 (ConnectX-7 management bridges whose VPD says SW_MNG) and
a GB200 compute tray, built by tests/support/hgxsysfs.py (no GPU; nothing captured), through the
real `nodeprep fabric-manager` command that a systemd ExecCondition runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from nodeprep.cli import main
from nodeprep.node.fabric import MELLANOX, NVIDIA, PciDevice, decide, read_pci
from tests.support import hgxsysfs


@pytest.mark.parametrize("machine, name, needed, reason", [
    ("hgx-h100", "HGX/DGX A100/H100/H200", True,
     "4 NVSwitch devices (PCI class 0x0680: 0000:05:00.0, 0000:06:00.0, 0000:07:00.0, 0000:08:00.0)"),
    ("hgx-b200", "HGX B200/B300", True,
     "NVSwitch management bridge (VPD SW_MNG: 0000:03:00.0, 0000:04:00.0)"),
    ("gb200", "GB200/GB300 NVL", False, "GB200 GPUs: the NVSwitch fabric is managed off-host"),
])
def test_each_machine_type_from_its_sysfs(tmp_path: Path, machine: str, name: str, needed: bool,
                                          reason: str) -> None:
    sysfs = hgxsysfs.MACHINES[machine](tmp_path / "sys")
    d = decide(read_pci(sysfs))
    assert (d.machine.name, d.needed, d.reason) == (name, needed, reason)
    r = CliRunner().invoke(main, ["fabric-manager", "--sysfs-root", str(sysfs), "--condition"])
    assert r.exit_code == (0 if needed else 1), r.output
    says = "needed" if needed else "not needed"
    assert r.stdout == f"{name}: Fabric Manager {says} ({reason})\n"
    r = CliRunner().invoke(main, ["fabric-manager", "--sysfs-root", str(sysfs), "--json"])
    out = json.loads(r.stdout)
    assert out == {"machine": name, "fabric_manager": needed, "reason": reason}


def test_the_nics_of_an_hgx_h100_are_no_management_bridges(tmp_path: Path) -> None:
    devices = read_pci(hgxsysfs.hgx_h100(tmp_path / "sys"))
    assert devices is not None
    nics = [d for d in devices if d.vendor == MELLANOX]
    assert len(nics) == 8 and not any(d.sw_mng for d in nics)


def test_off_host_wins_and_nothing_or_unreadable_is_decided() -> None:
    gb = PciDevice("0008:01:00.0", NVIDIA, 0x2941, 0x0302)
    switch = PciDevice("0000:05:00.0", NVIDIA, 0x22A3, 0x0680)
    assert not decide((gb, switch)).needed  # GB200 first, whatever else the board shows
    l40s = PciDevice("0000:01:00.0", NVIDIA, 0x26B9, 0x0302)
    assert decide((l40s,)).machine.name == "no NVSwitch fabric" and not decide((l40s,)).needed
    other_bridge = PciDevice("0000:00:1f.0", 0x8086, 0x1234, 0x0680)  # class 0x0680 but not NVIDIA's
    assert not decide((other_bridge,)).needed
    undetermined = decide(None)
    assert undetermined.needed and undetermined.machine.name == "undetermined"


def test_a_vpd_that_is_not_a_file_is_not_read(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    hgxsysfs.device(sysfs, "0000:03:00.0", "0x15b3", "0x1021", hgxsysfs.IB_CLASS)
    (sysfs / "bus/pci/devices/0000:03:00.0/vpd").symlink_to("/dev/zero")
    devices = read_pci(sysfs)
    assert devices == (PciDevice("0000:03:00.0", MELLANOX, 0x1021, 0x0207, False),)
    assert not decide(devices).needed
