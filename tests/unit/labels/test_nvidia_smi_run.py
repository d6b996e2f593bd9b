"""Running `nvidia-smi -q -x`: there is no driver here, so nodeprep's own install location
(<root>/opt/nvidia/current/bin/nvidia-smi) holds a stand-in script that prints a real capture, or hangs.
The module being 'loaded' is a directory in the temp sysfs."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from nodeprep import runner
from nodeprep.labels.core import LabelOptions, node_labels

from .conftest import add_pci


@pytest.fixture(autouse=True)
def no_host_nvidia_smi() -> None:
    if runner.which("nvidia-smi"):
        pytest.skip("a real nvidia-smi is on PATH here")


def stand_in(root: Path, body: str) -> Path:
    bindir = root / "opt/nvidia/535.54.03/bin"
    bindir.mkdir(parents=True)
    tool = bindir / "nvidia-smi"
    tool.write_text("#!/bin/sh\n" + body + "\n")
    tool.chmod(0o755)
    os.symlink("535.54.03", root / "opt/nvidia/current")
    return tool


def test_runs_nvidia_smi_from_the_active_driver_root(empty_root: Path, empty_sysfs: Path, tmp_path: Path,
                                                     nvidia_smi_fixtures: Path,
                                                     options: Callable[..., LabelOptions]) -> None:
    args_file = tmp_path / "args"
    xml = nvidia_smi_fixtures / "tesla-t4_515.105.01.xml"
    stand_in(empty_root, f'echo "$@ $LD_LIBRARY_PATH" > {args_file}\ncat {xml}')
    (empty_sysfs / "module/nvidia").mkdir(parents=True)
    add_pci(empty_sysfs, "0000:00:1e.0", 0x10DE, 0x1EB8, 0x030200)
    result = node_labels(options(cloud="none", run_nvidia_smi=True))
    assert result.sources["gpu"] == "nvidia-smi"
    assert result.labels["nvidia.com/gpu.memory"] == "15360"
    assert result.labels["nvidia.com/gpu.mode"] == "compute"
    assert args_file.read_text().strip() == f"-q -x {empty_root}/opt/nvidia/current/lib64"


def test_hung_nvidia_smi_falls_back_to_pci(empty_root: Path, empty_sysfs: Path,
                                           options: Callable[..., LabelOptions]) -> None:
    stand_in(empty_root, "exec sleep 30")  # exec: the timeout kills sleep itself
    (empty_sysfs / "module/nvidia").mkdir(parents=True)
    add_pci(empty_sysfs, "0000:00:1e.0", 0x10DE, 0x1EB8, 0x030200)
    result = node_labels(options(cloud="none", run_nvidia_smi=True, source_timeout=0.3, total_timeout=0.45))
    assert result.sources["gpu"] == "pci"
    assert result.labels["nvidia.com/gpu.product"] == "Tesla-T4"
    assert any("nvidia-smi" in w for w in result.warnings), result.warnings


def test_module_not_loaded_means_nvidia_smi_not_run(empty_root: Path, tmp_path: Path,
                                                    options: Callable[..., LabelOptions]) -> None:
    marker = tmp_path / "ran"
    stand_in(empty_root, f"touch {marker}")
    result = node_labels(options(cloud="none", run_nvidia_smi=True))
    assert not marker.exists() and result.sources["gpu"] == "pci"
