"""GPU facts from PCI sysfs trees built in temporary directories from real PCI ids, named through the
real pci.ids database (Debian package pci.ids, scripts/deps/labels.apt)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from nodeprep import runner
from nodeprep.labels import pciids
from nodeprep.labels.core import LabelOptions, node_labels
from nodeprep.labels.gpu import from_sysfs

from .conftest import add_pci

H100, A100, T4, NVSWITCH = 0x2330, 0x20B2, 0x1EB8, 0x22A3


@pytest.fixture(scope="module", autouse=True)
def pci_db() -> dict[str, str]:
    db = pciids.nvidia_devices()
    if not db:
        pytest.fail("no pci.ids database installed (scripts/deps/labels.apt: pci.ids)")
    return db


def hgx(sysfs: Path) -> None:
    """An HGX H100 board: 8 GPUs (3D controller 0x0302) and 4 NVSwitch bridges (0x0680), plus a
    non-NVIDIA VGA and host bridge."""
    for i, bus in enumerate(("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")):
        add_pci(sysfs, f"0000:{bus}:00.0", 0x10DE, H100, 0x030200, subsys=0x16C1 + i * 0)
    for bus in ("05", "06", "07", "08"):
        add_pci(sysfs, f"0000:{bus}:00.0", 0x10DE, NVSWITCH, 0x068000)
    add_pci(sysfs, "0000:03:00.0", 0x1A03, 0x2000, 0x030000)  # ASPEED BMC VGA
    add_pci(sysfs, "0000:00:00.0", 0x8086, 0x09A2, 0x060000)


def test_pci_ids_names_from_the_real_database(pci_db: dict[str, str]) -> None:
    assert pci_db["1eb8"] == "TU104GL [Tesla T4]"
    assert pci_db["20b2"] == "GA100 [A100 SXM4 80GB]"
    assert pci_db["2330"].replace(" [", "[") == "GH100[H100 SXM5 80GB]"  # spacing differs by release
    assert pciids.marketing_name(pci_db["1eb8"]) == "Tesla T4"
    assert pciids.marketing_name(pci_db["2330"]) == "NVIDIA H100 SXM5 80GB"
    assert [pciids.chip_of(pci_db[d]) for d in ("1eb8", "20b2", "2330")] == ["TU104", "GA100", "GH100"]


def test_parse_vendor_block_only() -> None:
    text = ("# comment\n10de  NVIDIA Corporation\n\t2330  GH100 [H100 SXM5 80GB]\n"
            "\t\t10de 16c1  H100 SXM5 80GB\n"
            "# a comment inside\n\t1eb8  TU104GL [Tesla T4]\n10df  Emulex Corporation\n\t0101  LP101\n"
            "C 03  Display controller\n\t02  3D controller\n")
    assert pciids.parse_vendor(text) == {"2330": "GH100 [H100 SXM5 80GB]", "1eb8": "TU104GL [Tesla T4]"}
    assert pciids.parse_vendor(text, "abcd") == {}


def test_hgx_h100_counts_gpus_not_nvswitches(empty_sysfs: Path, options: Callable[..., LabelOptions]) -> None:
    hgx(empty_sysfs)
    (empty_sysfs / "module" / "nvidia").mkdir(parents=True)
    (empty_sysfs / "module" / "nvidia" / "version").write_text("550.127.05\n")
    result = node_labels(options(cloud="none"))
    nv = {k: v for k, v in result.labels.items() if k.startswith("nvidia.com/")}
    assert nv == {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.machine": "unknown",
        "nvidia.com/gpu.product": "NVIDIA-H100-SXM5-80GB",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.mode": "compute",
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mps.capable": "false",
        "nvidia.com/cuda.driver.major": "550",
        "nvidia.com/cuda.driver.minor": "127",
        "nvidia.com/cuda.driver.rev": "05",
        "nvidia.com/cuda.driver-version.major": "550",
        "nvidia.com/cuda.driver-version.minor": "127",
        "nvidia.com/cuda.driver-version.revision": "05",
        "nvidia.com/cuda.driver-version.full": "550.127.05",
        "nvidia.com/vgpu.present": "false",  # config spaces read in full, no vGPU capability
    }
    assert result.sources["gpu"] == "pci"
    facts = from_sysfs(empty_sysfs)
    assert sorted(g.bus_id for g in facts.gpus)[:2] == ["0000:18:00.0", "0000:2a:00.0"]
    assert all(g.pci_device == "10de:2330" for g in facts.gpus)


def test_nvml_and_nvidia_smi_absent_fall_back_to_pci(empty_sysfs: Path,
                                                     options: Callable[..., LabelOptions]) -> None:
    """With the nvidia module 'loaded' (sysfs says so) but no libnvidia-ml and no nvidia-smi on this
    machine, NVML and nvidia-smi report themselves unavailable and PCI sysfs answers."""
    if runner.which("nvidia-smi"):
        pytest.skip("nvidia-smi is installed here")
    add_pci(empty_sysfs, "0000:00:1e.0", 0x10DE, T4, 0x030200)
    (empty_sysfs / "module" / "nvidia").mkdir(parents=True)
    result = node_labels(options(cloud="none", use_nvml=True, run_nvidia_smi=True))
    assert result.sources["gpu"] == "pci"
    assert result.labels["nvidia.com/gpu.product"] == "Tesla-T4"
    assert result.labels["nvidia.com/gpu.family"] == "turing"
    assert result.labels["nvidia.com/mig.capable"] == "false"
    assert "nvidia.com/cuda.driver-version.full" not in result.labels  # no version file in this tree
    assert result.warnings == []


def test_a100_and_graphics_mode(empty_sysfs: Path, options: Callable[..., LabelOptions]) -> None:
    add_pci(empty_sysfs, "0000:07:00.0", 0x10DE, A100, 0x030000)  # VGA class: graphics mode
    result = node_labels(options(cloud="none"))
    assert result.labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert result.labels["nvidia.com/gpu.mode"] == "graphics"
    assert (result.labels["nvidia.com/gpu.compute.major"],
            result.labels["nvidia.com/gpu.compute.minor"]) == ("8", "0")


def test_mixed_models_label_the_most_common_and_warn(empty_sysfs: Path,
                                                     options: Callable[..., LabelOptions]) -> None:
    add_pci(empty_sysfs, "0000:01:00.0", 0x10DE, T4, 0x030200)
    add_pci(empty_sysfs, "0000:02:00.0", 0x10DE, T4, 0x030200)
    add_pci(empty_sysfs, "0000:03:00.0", 0x10DE, A100, 0x030000)
    result = node_labels(options(cloud="none"))
    assert result.labels["nvidia.com/gpu.count"] == "2"
    assert result.labels["nvidia.com/gpu.product"] == "Tesla-T4"
    assert result.labels["nvidia.com/gpu.mode"] == "unknown"  # mixed classes, as GFD
    assert any("several GPU models" in w for w in result.warnings)


def test_no_gpu_no_nvidia_labels(empty_sysfs: Path, options: Callable[..., LabelOptions]) -> None:
    add_pci(empty_sysfs, "0000:05:00.0", 0x10DE, NVSWITCH, 0x068000)
    result = node_labels(options(cloud="none"))
    assert not [k for k in result.labels if k.startswith("nvidia.com/")]
    assert result.labels["nodeprep.dev/os"] == "debian-12"


def test_unknown_device_without_database(empty_sysfs: Path, tmp_path: Path,
                                         options: Callable[..., LabelOptions]) -> None:
    empty_db = tmp_path / "pci.ids"
    empty_db.write_text("# no vendors\n")
    add_pci(empty_sysfs, "0000:01:00.0", 0x10DE, 0x2BB4, 0x030200)
    result = node_labels(options(cloud="none", pci_ids=empty_db))
    assert result.labels["nvidia.com/gpu.product"] == "NVIDIA-Device-2bb4"
    assert "nvidia.com/gpu.family" not in result.labels
    assert "nvidia.com/mig.capable" not in result.labels


def test_missing_sysfs_is_a_warning(tmp_path: Path, options: Callable[..., LabelOptions]) -> None:
    result = node_labels(options(cloud="none", sysfs_root=tmp_path / "nothing"))
    assert result.sources["gpu"] == "none"
    assert any("no source available" in w for w in result.warnings)
