"""vGPU labels as GFD sets them (nodeprep/labels/vgpu.py against k8s-device-plugin v0.20.0
internal/vgpu): `nvidia.com/vgpu.present` from the PCI configuration space of the NVIDIA devices.

The two configuration spaces are GFD's own test data (internal/vgpu/pciutil.go, Apache-2.0): a
passthrough GPU (Tesla, vendor capability without the "VF" signature) and a vGPU guest device whose
capability names host driver 460.16, branch r460_00 (GFD's vgpu_test.go expects exactly those).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from nodeprep.labels import vgpu
from nodeprep.labels.core import LabelOptions, node_labels

from .conftest import add_pci, pci_config

PASSTHROUGH = bytes.fromhex(
    "de108a1107041000a100000300f80000000000ec0c0000e0000000000c0000ea0000000001c1000000000000de101410"
    "000000ee600000000000000005010000de1014100000000000000000000000000100000001000000ced6230000000000"
    "0168030008000000057881000070e6fe000000000043000010b40200e18d640010290000033d45100000011100000000"
    "00000000000000000000000013000000000000000e00000003003e000000000000000000090014010000000000000000"
    "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
    "00000000000000000000000000000000"
)
VGPU = bytes.fromhex(
    "de10b81e0205ff06a100000300000000000000fc0c0000d000000000040000fa000000000000000000000000de100f13"
    "00000000d0000000000000000a010000000000000000000000000000000000000100000001000000ced6230000000000"
    "0000000000000000050081000000e0fe000000004e400000000000000000000000000000000000000000000000000000"
    "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
    "0000000000000000000000000000000009681b564600163436302e313600000000723436305f30300000000000000000"
    "00000000000000000000000000000000"
)
T4 = "tesla-t4_515.105.01.xml"
BUS = "0000:00:1e.0"  # the T4 capture's bus id as sysfs names it


def labels_with(config: bytes, sysfs: Path, nvidia_smi_fixtures: Path,
                options: Callable[..., LabelOptions]) -> tuple[dict[str, str], list[str]]:
    dev = add_pci(sysfs, BUS, 0x10DE, 0x1EB8, 0x030200)
    (dev / "config").write_bytes(config)
    result = node_labels(options(nvidia_smi_xml=nvidia_smi_fixtures / T4, cloud="none"))
    return {k: v for k, v in result.labels.items() if k.startswith("nvidia.com/vgpu")}, result.warnings


def test_gfd_test_data() -> None:
    cap = vgpu.vendor_capability(VGPU)
    assert cap is not None and len(cap) == 27 and cap[0] == 9 and vgpu.is_vgpu(cap)
    assert vgpu.host_driver(cap) == ("460.16", "r460_00")
    passthrough = vgpu.vendor_capability(PASSTHROUGH)
    assert passthrough is not None and len(passthrough) == 20 and not vgpu.is_vgpu(passthrough)


def test_a_vgpu_guest_is_labelled_with_its_host_driver(empty_sysfs: Path, nvidia_smi_fixtures: Path,
                                                       options: Callable[..., LabelOptions]) -> None:
    got, warnings = labels_with(VGPU, empty_sysfs, nvidia_smi_fixtures, options)
    assert got == {"nvidia.com/vgpu.present": "true", "nvidia.com/vgpu.host-driver-version": "460.16",
                   "nvidia.com/vgpu.host-driver-branch": "r460_00"}
    assert not [w for w in warnings if w.startswith("vgpu:")]


def test_a_passthrough_gpu_is_not_a_vgpu(empty_sysfs: Path, nvidia_smi_fixtures: Path,
                                         options: Callable[..., LabelOptions]) -> None:
    got, _ = labels_with(PASSTHROUGH, empty_sysfs, nvidia_smi_fixtures, options)
    assert got == {"nvidia.com/vgpu.present": "false"}


def test_an_unprivileged_read_sets_no_vgpu_label(empty_sysfs: Path, nvidia_smi_fixtures: Path,
                                                 options: Callable[..., LabelOptions]) -> None:
    """sysfs gives a non-root reader the first 64 bytes; GFD then sets no vGPU label, nor does nodeprep."""
    got, warnings = labels_with(VGPU[:64], empty_sysfs, nvidia_smi_fixtures, options)
    assert got == {}
    assert any(w.startswith("vgpu: ") and "64 bytes, not the 256 of a full read" in w for w in warnings)


@pytest.mark.parametrize("capability", [
    bytes([0x09, 0x40, 0x08, 0x56, 0x46, 0x01, 0x00, 0x00]),  # a record of length 0: no endless walk
    bytes([0x09, 0x00, 0x0A, 0x56, 0x46, 0x00, 0x16]) + b"460",  # 10 bytes long: the record is cut short
    bytes([0x09, 0x00, 0x05, 0x56, 0x46]),  # the signature alone
])
def test_hostile_capabilities_end_without_an_error(capability: bytes, empty_sysfs: Path,
                                                   nvidia_smi_fixtures: Path,
                                                   options: Callable[..., LabelOptions]) -> None:
    got, warnings = labels_with(pci_config(0x10DE, 0x1EB8, 0x030200, capability), empty_sysfs,
                                nvidia_smi_fixtures, options)
    assert got == {"nvidia.com/vgpu.present": "true"}
    assert any("vGPU capability without a host driver record" in w for w in warnings)


def test_a_device_without_a_config_space_sets_no_vgpu_label(empty_sysfs: Path, nvidia_smi_fixtures: Path,
                                                             options: Callable[..., LabelOptions]) -> None:
    dev = add_pci(empty_sysfs, BUS, 0x10DE, 0x1EB8, 0x030200)
    (dev / "config").unlink()
    result = node_labels(options(nvidia_smi_xml=nvidia_smi_fixtures / T4, cloud="none"))
    assert "nvidia.com/vgpu.present" not in result.labels
    assert not [w for w in result.warnings if w.startswith("vgpu:")]


def test_a_capability_chain_that_loops_ends(empty_sysfs: Path) -> None:
    config = bytearray(pci_config(0x10DE, 0x1EB8, 0x030200, bytes([0x01, 0x40, 0x08])))  # next = itself
    assert vgpu.vendor_capability(bytes(config)) is None
    config[0x34] = 0xFE  # a pointer at the end of the space: the entry would run past it
    assert vgpu.vendor_capability(bytes(config)) is None
