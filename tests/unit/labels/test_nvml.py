"""GPU facts through NVML.

There is no GPU or libnvidia-ml here, so the nvidia-ml-py module (the NVML boundary) is replaced by a
stand-in answering with the values of the real A100-SXM4-80GB capture in tests/fixtures/nvidia-smi
(name, 81920 MiB, bus 00000000:01:00.0, device 0x20B210DE, driver 535.54.03, CUDA 12.2, MIG enabled
with four instances of 14 SMs / 19968 MiB). NVML adds what the XML lacks: compute capability 8.0 and
the MIG profile name; on an A100 80GB, 14 SMs with 19968 MiB is the 1g.20gb profile.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nodeprep.labels.core import LabelOptions, node_labels

from .conftest import add_pci


class NVMLError(Exception):
    pass


def fake_pynvml(mig_profiles: list[str]) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    gpu, migs = object(), [object() for _ in mig_profiles]
    calls: list[str] = []

    def rec(name: str, value: Any) -> Callable[..., Any]:
        def f(*a: Any) -> Any:
            calls.append(name)
            return value(*a) if callable(value) else value
        return f

    def name(h: object) -> str:
        return ("NVIDIA A100-SXM4-80GB" if h is gpu
                else f"NVIDIA A100-SXM4-80GB MIG {mig_profiles[migs.index(h)]}")

    m.NVMLError = NVMLError  # type: ignore[attr-defined]
    m.NVML_DEVICE_MIG_ENABLE = 1  # type: ignore[attr-defined]
    m.nvmlInit = rec("init", None)  # type: ignore[attr-defined]
    m.nvmlShutdown = rec("shutdown", None)  # type: ignore[attr-defined]
    m.nvmlSystemGetDriverVersion = rec("driver", "535.54.03")  # type: ignore[attr-defined]
    m.nvmlSystemGetCudaDriverVersion = rec("cuda", 12020)  # type: ignore[attr-defined]
    m.nvmlDeviceGetCount = rec("count", 1)  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = rec("handle", gpu)  # type: ignore[attr-defined]
    m.nvmlDeviceGetName = rec("name", name)  # type: ignore[attr-defined]
    m.nvmlDeviceGetMemoryInfo = rec("mem", types.SimpleNamespace(total=81920 * 2**20))  # type: ignore[attr-defined]
    m.nvmlDeviceGetCudaComputeCapability = rec("cc", (8, 0))  # type: ignore[attr-defined]
    m.nvmlDeviceGetMigMode = rec("mig", (1, 1))  # type: ignore[attr-defined]
    m.nvmlDeviceGetPciInfo = rec("pci", types.SimpleNamespace(  # type: ignore[attr-defined]
        busId=b"00000000:01:00.0", pciDeviceId=0x20B210DE))
    m.nvmlDeviceGetMaxMigDeviceCount = rec("maxmig", 7)  # type: ignore[attr-defined]
    m.nvmlDeviceGetBrand = rec("brand", 14)  # type: ignore[attr-defined]  # NVML_BRAND_NVIDIA

    def mig_handle(h: object, i: int) -> object:
        if i >= len(migs):
            raise NVMLError("Not Found")
        return migs[i]

    m.nvmlDeviceGetMigDeviceHandleByIndex = mig_handle  # type: ignore[attr-defined]
    m.nvmlDeviceGetAttributes_v2 = rec("attrs", types.SimpleNamespace(  # type: ignore[attr-defined]
        multiprocessorCount=14, sharedCopyEngineCount=1, sharedDecoderCount=1, sharedEncoderCount=0,
        sharedJpegCount=0, sharedOfaCount=0, gpuInstanceSliceCount=1, computeInstanceSliceCount=1,
        memorySizeMB=19968))
    m.calls = calls  # type: ignore[attr-defined]
    return m


@pytest.fixture
def nvml_sysfs(empty_sysfs: Path) -> Path:
    (empty_sysfs / "module" / "nvidia").mkdir(parents=True)
    add_pci(empty_sysfs, "0000:01:00.0", 0x10DE, 0x20B2, 0x030200)
    return empty_sysfs


def test_nvml_full_gpu_labels(nvml_sysfs: Path, monkeypatch: pytest.MonkeyPatch,
                              options: Callable[..., LabelOptions]) -> None:
    fake = fake_pynvml(["1g.20gb"] * 4)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    result = node_labels(options(cloud="none", use_nvml=True))
    labels = result.labels
    assert result.sources["gpu"] == "nvml"
    assert (labels["nvidia.com/gpu.product"], labels["nvidia.com/gpu.count"],
            labels["nvidia.com/gpu.memory"]) == (
        "NVIDIA-A100-SXM4-80GB", "1", "81920")
    assert (labels["nvidia.com/gpu.compute.major"], labels["nvidia.com/gpu.compute.minor"]) == ("8", "0")
    assert labels["nvidia.com/gpu.mode"] == "compute"  # class read from sysfs by NVML's bus id
    assert labels["nvidia.com/mig.capable"] == "true" and labels["nvidia.com/gpu.replicas"] == "0"
    assert labels["nvidia.com/cuda.runtime-version.full"] == "12.2"
    assert "nvidia.com/mig.strategy" not in labels
    assert fake.calls[0] == "init" and fake.calls[-1] == "shutdown"
    assert [g.brand for g in result.facts.gpu.gpus] == ["nvidia"]  # the CUDA gate's (node.gpufacts)


def test_nvml_mig_single_and_mixed(nvml_sysfs: Path, monkeypatch: pytest.MonkeyPatch,
                                   options: Callable[..., LabelOptions]) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(["1g.20gb"] * 4))
    single = node_labels(options(cloud="none", use_nvml=True, mig_strategy="single")).labels
    assert {k: v for k, v in single.items() if k.startswith("nvidia.com/gpu.") and k not in (
        "nvidia.com/gpu.machine", "nvidia.com/gpu.mode", "nvidia.com/gpu.present", "nvidia.com/gpu.family",
        "nvidia.com/gpu.compute.major", "nvidia.com/gpu.compute.minor")} == {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-1g.20gb", "nvidia.com/gpu.count": "4",
        "nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.memory": "19968", "nvidia.com/gpu.multiprocessors": "14",
        "nvidia.com/gpu.slices.gi": "1", "nvidia.com/gpu.slices.ci": "1", "nvidia.com/gpu.engines.copy": "1",
        "nvidia.com/gpu.engines.decoder": "1", "nvidia.com/gpu.engines.encoder": "0",
        "nvidia.com/gpu.engines.jpeg": "0", "nvidia.com/gpu.engines.ofa": "0",
    }
    assert single["nvidia.com/mig.strategy"] == "single"

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(["1g.20gb", "1g.20gb", "2g.20gb+me"]))
    mixed = node_labels(options(cloud="none", use_nvml=True, mig_strategy="mixed")).labels
    assert mixed["nvidia.com/mig-1g.20gb.count"] == "2"
    assert mixed["nvidia.com/mig-2g.20gb.me.count"] == "1"
    assert mixed["nvidia.com/mig-2g.20gb.me.product"] == "NVIDIA-A100-SXM4-80GB-MIG-2g.20gb.me"
    invalid = node_labels(options(cloud="none", use_nvml=True, mig_strategy="single")).labels
    assert (invalid["nvidia.com/gpu.product"], invalid["nvidia.com/gpu.count"]) == (
        "NVIDIA-A100-SXM4-80GB-MIG-INVALID", "0")


def test_nvml_init_failure_falls_back(nvml_sysfs: Path, monkeypatch: pytest.MonkeyPatch,
                                      options: Callable[..., LabelOptions]) -> None:
    fake = fake_pynvml([])

    def boom() -> None:
        raise NVMLError("Driver Not Loaded")

    fake.nvmlInit = boom  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    result = node_labels(options(cloud="none", use_nvml=True))
    assert (result.sources["gpu"] == "pci"
            and result.labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB")


def test_nvml_and_the_capture_agree_as_gpu_check_compares(nvml_sysfs: Path, monkeypatch: pytest.MonkeyPatch,
                                                          options: Callable[..., LabelOptions],
                                                          nvidia_smi_fixtures: Path) -> None:
    """acceptance/gpu/gpu_check.py's comparison on the A100 (NVML stand-in vs the real capture it was made
    from): every label agrees but the source's name; labels only NVML can give are allowed to be
    missing from the capture's; a changed value is found."""
    import importlib.util

    from tests.support.fixtures import REPO

    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "acceptance/gpu/gpu_check.py")
    assert spec and spec.loader
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(["1g.20gb"] * 4))
    nvml = node_labels(options(cloud="none", use_nvml=True)).labels
    xml = node_labels(options(cloud="none", nvidia_smi_xml=nvidia_smi_fixtures /
                              "a100-sxm4-80gb-mig_535.54.03.xml")).labels
    assert nvml["nodeprep.dev/gpu-source"] == "nvml" and xml["nodeprep.dev/gpu-source"] == "nvidia-smi"
    assert gpu_check.compare_labels(nvml, xml, only_a=set()) == []  # all agree, compute capability too
    del xml["nvidia.com/gpu.compute.major"]  # a GPU the device table does not know: XML has no compute cap
    assert gpu_check.compare_labels(nvml, xml, only_a=gpu_check.ONLY_NVML) == []
    changed = {**xml, "nvidia.com/gpu.memory": "40960"}
    assert gpu_check.compare_labels(nvml, changed, only_a=gpu_check.ONLY_NVML) == [
        "nvidia.com/gpu.memory: '81920' != '40960'"]
