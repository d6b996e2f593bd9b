"""Running `nvidia-smi -q -x`: there is no driver here, so this host's nvidia-smi (one on PATH, or the
running system's active driver root, gpu.DRIVER_NVIDIA_SMI) is a stand-in script that prints a real
capture, or hangs. The module being 'loaded' is a directory in the temp sysfs. One under an image's
root is never run (#35): tests/unit/labels/test_image_never_run.py."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from nodeprep.labels import gpu
from nodeprep.labels.core import LabelOptions, node_labels

from .conftest import add_pci, stand_in

pytestmark = pytest.mark.usefixtures("no_host_nvidia_smi")


@pytest.fixture
def host_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Path]:
    """Makes this host's nvidia-smi (on PATH) a stand-in running `body`."""
    def make(body: str) -> Path:
        host = tmp_path / "host"
        tool = stand_in(host, body)
        monkeypatch.setenv("PATH", f"{tool.parent}:{os.environ.get('PATH', '')}")
        return tool
    return make


def test_runs_the_host_s_nvidia_smi(empty_sysfs: Path, tmp_path: Path, nvidia_smi_fixtures: Path,
                                    host_smi: Callable[[str], Path],
                                    options: Callable[..., LabelOptions]) -> None:
    args_file = tmp_path / "args"
    xml = nvidia_smi_fixtures / "tesla-t4_515.105.01.xml"
    host_smi(f'echo "$@" > {args_file}\ncat {xml}')
    (empty_sysfs / "module/nvidia").mkdir(parents=True)
    add_pci(empty_sysfs, "0000:00:1e.0", 0x10DE, 0x1EB8, 0x030200)
    result = node_labels(options(cloud="none", run_nvidia_smi=True))
    assert result.sources["gpu"] == "nvidia-smi"
    assert result.labels["nvidia.com/gpu.memory"] == "15360"
    assert result.labels["nvidia.com/gpu.mode"] == "compute"
    assert args_file.read_text().strip() == "-q -x"


def test_live_root_runs_its_active_driver_root_s_nvidia_smi(empty_sysfs: Path, tmp_path: Path,
                                                            nvidia_smi_fixtures: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            options: Callable[..., LabelOptions]) -> None:
    args_file = tmp_path / "args"
    xml = nvidia_smi_fixtures / "tesla-t4_515.105.01.xml"
    tool = stand_in(tmp_path / "host", f'echo "$@ $LD_LIBRARY_PATH" > {args_file}\ncat {xml}')
    current = tmp_path / "host/opt/nvidia/current/bin/nvidia-smi"
    monkeypatch.setattr(gpu, "DRIVER_NVIDIA_SMI", current)
    assert tool.resolve() == current.resolve()
    (empty_sysfs / "module/nvidia").mkdir(parents=True)
    add_pci(empty_sysfs, "0000:00:1e.0", 0x10DE, 0x1EB8, 0x030200)
    result = node_labels(options(root=Path("/"), cloud="none", run_nvidia_smi=True))
    assert result.sources["gpu"] == "nvidia-smi"
    assert args_file.read_text().strip() == f"-q -x {tmp_path}/host/opt/nvidia/current/lib64"


def test_hung_nvidia_smi_falls_back_to_pci(empty_sysfs: Path, host_smi: Callable[[str], Path],
                                           options: Callable[..., LabelOptions]) -> None:
    host_smi("exec sleep 30")  # exec: the timeout kills sleep itself
    (empty_sysfs / "module/nvidia").mkdir(parents=True)
    add_pci(empty_sysfs, "0000:00:1e.0", 0x10DE, 0x1EB8, 0x030200)
    result = node_labels(options(cloud="none", run_nvidia_smi=True, source_timeout=0.3, total_timeout=0.45))
    assert result.sources["gpu"] == "pci"
    assert result.labels["nvidia.com/gpu.product"] == "Tesla-T4"
    assert any("nvidia-smi" in w for w in result.warnings), result.warnings


def test_module_not_loaded_means_nvidia_smi_not_run(tmp_path: Path, host_smi: Callable[[str], Path],
                                                    options: Callable[..., LabelOptions]) -> None:
    marker = tmp_path / "ran"
    host_smi(f"touch {marker}")
    result = node_labels(options(cloud="none", run_nvidia_smi=True))
    assert not marker.exists() and result.sources["gpu"] == "pci"
