"""The GPU self-test reading NVML: NVIDIA's NVML mock (tests/support/mocknvml.py, the 8-GPU HGX H100
machine) stands in for the GPUs and the driver, through a real `nodeprep verify-gpus` process whose
libnvidia-ml.so.1 is the mock. Persistence mode comes from `nvmlDeviceGetPersistenceMode`: the mock's
H100 profile has it enabled; a YAML derived from that profile (persistence_mode: disabled, written by
the test) stands for a node whose persistenced is not running."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from nodeprep import runner
from nodeprep.artifact import MANIFEST
from tests.support import mocknvml

REPO = Path(__file__).resolve().parents[3]
DRIVER = "550.163.01"  # what the mock's H100 profile reports


@pytest.fixture(autouse=True)
def _mock() -> None:
    reason = mocknvml.skip_reason()
    if reason:
        pytest.skip(reason)


def h100_buses() -> list[str]:
    data = yaml.safe_load(mocknvml.config("h100").read_text())
    return [d["pci"]["bus_id"].lower() for d in data["devices"]]


def node(tmp_path: Path, buses: list[str]) -> tuple[Path, Path]:
    root, sysfs = tmp_path / "root", tmp_path / "sys"
    (root / "opt/nvidia" / DRIVER).mkdir(parents=True)
    (root / "opt/nvidia" / DRIVER / MANIFEST).write_text("{}")
    (root / "opt/nvidia/current").symlink_to(DRIVER)
    (sysfs / "module/nvidia").mkdir(parents=True)
    (sysfs / "module/nvidia/version").write_text(DRIVER + "\n")
    for bus in buses:
        d = sysfs / "bus/pci/devices" / bus
        d.mkdir(parents=True)
        (d / "vendor").write_text("0x10de\n")
        (d / "class").write_text("0x030200\n")
    return root, sysfs


def verify(tmp_path: Path, machine: str | Path, *args: str) -> runner.Result:
    root, sysfs = node(tmp_path, h100_buses())
    env = mocknvml.env(tmp_path / "cache", machine, {"PATH": os.environ.get("PATH", ""), "LC_ALL": "C",
                                                     "PYTHONPATH": str(REPO)})
    return runner.run([sys.executable, "-m", "nodeprep.cli", "verify-gpus", "--root", str(root),
                       "--sysfs-root", str(sysfs), "--json", *args], env=env, check=False, timeout=120)


def test_persistence_mode_is_nvmls_on_the_hgx_h100(tmp_path: Path) -> None:
    r = verify(tmp_path, "h100", "--persistence-mode", "enabled")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["passed"] and out["source"] == "nvml" and out["driver_version"] == DRIVER
    assert len(out["gpus"]) == 8 and {g["persistence"] for g in out["gpus"]} == {"enabled"}
    assert out["gpus"][0] == {"bus_id": "0000:1a:00.0", "name": "NVIDIA H100 80GB HBM3",
                              "persistence": "enabled"}


def test_persistence_disabled_fails_the_self_test(tmp_path: Path) -> None:
    data = yaml.safe_load(mocknvml.config("h100").read_text())
    data["device_defaults"]["persistence_mode"] = "disabled"  # derived from the H100 profile
    derived = tmp_path / "h100-persistence-disabled.yaml"
    derived.write_text(yaml.safe_dump(data))
    r = verify(tmp_path, derived, "--persistence-mode", "enabled")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("error: GPU self-test failed: persistence: GPU 0000:1a:00.0 has persistence "
                                "mode disabled, the profile asks for enabled"), r.stderr
    assert json.loads(r.stdout)["gpus"][0]["persistence"] == "disabled"
