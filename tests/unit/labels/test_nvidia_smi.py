"""GFD labels from the real `nvidia-smi -q -x` captures in tests/fixtures/nvidia-smi.

Expected values were written by reading each XML file and GFD's rules (internal/lm/*.go), not by
running this code: product = sanitise(product_name), count = GPUs listed, memory = fb total MiB,
family/compute from the chip (pci.ids name of pci_device_id) or the architecture, driver/CUDA
versions split on '.', replicas 0 for MIG-enabled GPUs (GFD labels them without sharing).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from nodeprep.errors import InputError
from nodeprep.labels import pciids
from nodeprep.labels.core import LabelOptions, node_labels
from nodeprep.labels.gpu import parse_nvidia_smi_xml

from .conftest import add_pci, write_dmi


def versions(driver: str, cuda: str) -> dict[str, str]:
    major, minor, rev = driver.split(".")
    cmaj, cmin = cuda.split(".")
    return {
        "nvidia.com/cuda.driver.major": major, "nvidia.com/cuda.driver.minor": minor,
        "nvidia.com/cuda.driver.rev": rev,
        "nvidia.com/cuda.driver-version.major": major, "nvidia.com/cuda.driver-version.minor": minor,
        "nvidia.com/cuda.driver-version.revision": rev, "nvidia.com/cuda.driver-version.full": driver,
        "nvidia.com/cuda.runtime.major": cmaj, "nvidia.com/cuda.runtime.minor": cmin,
        "nvidia.com/cuda.runtime-version.major": cmaj, "nvidia.com/cuda.runtime-version.minor": cmin,
        "nvidia.com/cuda.runtime-version.full": cuda,
    }


COMMON = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.machine": "unknown",
          "nvidia.com/gpu.sharing-strategy": "none", "nvidia.com/mps.capable": "false",
          "nvidia.com/gpu.mode": "unknown", "nvidia.com/vgpu.present": "false"}

EXPECTED: dict[str, dict[str, str]] = {
    "a100-sxm4-80gb-mig_535.54.03.xml": {
        **COMMON, **versions("535.54.03", "12.2"),
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "1",
        "nvidia.com/gpu.memory": "81920", "nvidia.com/gpu.replicas": "0",
        "nvidia.com/gpu.family": "ampere", "nvidia.com/gpu.compute.major": "8",
        "nvidia.com/gpu.compute.minor": "0", "nvidia.com/mig.capable": "true",
    },
    "tesla-t4_515.105.01.xml": {
        **COMMON, **versions("515.105.01", "11.7"),
        "nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": "15360",
        "nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.family": "turing",
        "nvidia.com/gpu.compute.major": "7", "nvidia.com/gpu.compute.minor": "5",
        "nvidia.com/mig.capable": "false",
    },
    # pci_device_id is masked (000000DE) in this capture: family from <product_architecture> only.
    "a10g_515.105.01.xml": {
        **COMMON, **versions("515.105.01", "11.7"),
        "nvidia.com/gpu.product": "NVIDIA-A10G", "nvidia.com/gpu.count": "1",
        "nvidia.com/gpu.memory": "23028",
        "nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.family": "ampere", "nvidia.com/mig.capable": "false",
    },
    "dual-rtx-a5000_590.44.01.xml": {
        **COMMON, **versions("590.44.01", "13.1"),
        "nvidia.com/gpu.product": "NVIDIA-RTX-A5000", "nvidia.com/gpu.count": "2",
        "nvidia.com/gpu.memory": "24564", "nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.family": "ampere",
        "nvidia.com/gpu.compute.major": "8", "nvidia.com/gpu.compute.minor": "6",
        "nvidia.com/mig.capable": "false",
    },
    "rtx-pro-6000-blackwell-maxq_590.44.01.xml": {
        **COMMON, **versions("590.44.01", "13.1"),
        "nvidia.com/gpu.product": "NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-Edition",
        "nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": "97887", "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.family": "blackwell", "nvidia.com/mig.capable": "false",
    },
}


@pytest.fixture(scope="module")
def pci_db() -> dict[str, str]:
    db = pciids.nvidia_devices()
    if not db:
        pytest.fail("no pci.ids database installed (scripts/deps/labels.apt: pci.ids)")
    return db


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_labels(name: str, nvidia_smi_fixtures: Path, options: Callable[..., LabelOptions],
                        pci_db: dict[str, str]) -> None:
    want = dict(EXPECTED[name])
    if name.startswith("rtx-pro-6000") and "2bb4" in pci_db:
        # Newer pci.ids name device 2bb4 (GB202GL); Debian 12's 2023 database does not.
        assert pciids.chip_of(pci_db["2bb4"]) == "GB202"
        want.update({"nvidia.com/gpu.compute.major": "12", "nvidia.com/gpu.compute.minor": "0"})
    result = node_labels(options(nvidia_smi_xml=nvidia_smi_fixtures / name, cloud="none"))
    got = {k: v for k, v in result.labels.items() if k.startswith("nvidia.com/")}
    assert got == want
    assert result.sources["gpu"] == "nvidia-smi"
    assert result.labels["nodeprep.dev/gpu-source"] == "nvidia-smi"


def test_trimmed_capture_warns_about_attached_count(nvidia_smi_fixtures: Path,
                                                    options: Callable[..., LabelOptions]) -> None:
    result = node_labels(options(nvidia_smi_xml=nvidia_smi_fixtures / "a100-sxm4-80gb-mig_535.54.03.xml",
                                 cloud="none"))
    assert any("reports 4 attached GPUs but lists 1" in w for w in result.warnings)


def test_mig_devices_parsed(nvidia_smi_fixtures: Path) -> None:
    facts = parse_nvidia_smi_xml((nvidia_smi_fixtures / "a100-sxm4-80gb-mig_535.54.03.xml").read_bytes())
    (gpu,) = facts.gpus
    assert gpu.mig_enabled and gpu.mig_capable
    assert [m.memory_mib for m in gpu.mig_devices] == [19968] * 4
    assert all(m.attributes["multiprocessors"] == 14 and m.profile is None for m in gpu.mig_devices)
    assert gpu.bus_id == "0000:01:00.0" and gpu.pci_device == "10de:20b2"


def test_mig_strategy_without_profiles_warns(nvidia_smi_fixtures: Path,
                                             options: Callable[..., LabelOptions]) -> None:
    result = node_labels(options(nvidia_smi_xml=nvidia_smi_fixtures / "a100-sxm4-80gb-mig_535.54.03.xml",
                                 cloud="none", mig_strategy="single"))
    assert result.labels["nvidia.com/mig.strategy"] == "single"
    assert result.labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert any("MIG profile names unknown" in w for w in result.warnings)


def test_gpu_mode_and_machine_from_sysfs_and_dmi(nvidia_smi_fixtures: Path, empty_sysfs: Path, tmp_path: Path,
                                                 options: Callable[..., LabelOptions]) -> None:
    """The capture's bus id 00000000:00:1E.0 is looked up as sysfs 0000:00:1e.0 (class 0x0302 = compute);
    gpu.machine is GFD's sanitised DMI product name."""
    add_pci(empty_sysfs, "0000:00:1e.0", 0x10DE, 0x1EB8, 0x030200)
    dmi = write_dmi(tmp_path / "dmi2", product_name="ProLiant DL380 Gen10 (Plus)")
    result = node_labels(options(nvidia_smi_xml=nvidia_smi_fixtures / "tesla-t4_515.105.01.xml",
                                 dmi_root=dmi, cloud="none"))
    assert result.labels["nvidia.com/gpu.mode"] == "compute"
    assert result.labels["nvidia.com/gpu.machine"] == "ProLiant-DL380-Gen10-Plus"
    assert result.labels["node.kubernetes.io/instance-type"] == "ProLiant-DL380-Gen10-Plus"


def test_broken_xml_is_input_error(tmp_path: Path, options: Callable[..., LabelOptions]) -> None:
    bad = tmp_path / "smi.xml"
    bad.write_text("<nvidia_smi_log><gpu>")
    with pytest.raises(InputError, match=f"^{bad}: not nvidia-smi XML"):
        node_labels(options(nvidia_smi_xml=bad, cloud="none"))
    other = tmp_path / "other.xml"
    other.write_text("<html/>")
    with pytest.raises(InputError, match="root element is <html>"):
        node_labels(options(nvidia_smi_xml=other, cloud="none"))
