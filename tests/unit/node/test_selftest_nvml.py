"""The GPU self-test reading NVML: NVIDIA's NVML mock (tests/support/mocknvml.py, the 8-GPU HGX H100
machine, and the A100 one) stands in for the GPUs and the driver, through a real `nodeprep
verify-gpus` process whose libnvidia-ml.so.1 is the mock. Persistence mode comes from
`nvmlDeviceGetPersistenceMode`, the fabric from `nvmlDeviceGetGpuFabricInfo`: the mock's H100 profile
has persistence enabled and its fabric COMPLETED; YAMLs derived from that profile (written by the
tests: persistence_mode disabled, fabric state in_progress) stand for a node whose persistenced is not
running and one whose Fabric Manager has not finished."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from nodeprep import runner
from tests.support import mocknvml
from tests.support.drivertree import driver_node

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
    return driver_node(tmp_path, DRIVER, DRIVER, buses)


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
                              "persistence": "enabled", "fabric": "Completed"}


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


def test_the_fabric_of_the_hgx_h100_is_completed(tmp_path: Path) -> None:
    """The mock's H100 profile: fabric state `auto`, which it answers as COMPLETED (no fabric manager
    of its own is configured)."""
    r = verify(tmp_path, "h100", "--fabric-timeout", "0")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert {g["fabric"] for g in out["gpus"]} == {"Completed"} and "fabric" in out["checked"]


def test_a100_answers_no_fabric_and_passes(tmp_path: Path) -> None:
    """The A100 profile's NVML says NOT_SUPPORTED to GpuFabricInfo: no fabric check (A100 buses)."""
    data = yaml.safe_load(mocknvml.config("a100").read_text())
    root, sysfs = node(tmp_path, [d["pci"]["bus_id"].lower() for d in data["devices"]])
    env = mocknvml.env(tmp_path / "cache", "a100", {"PATH": os.environ.get("PATH", ""), "LC_ALL": "C",
                                                    "PYTHONPATH": str(REPO)})
    r = runner.run([sys.executable, "-m", "nodeprep.cli", "verify-gpus", "--root", str(root), "--sysfs-root",
                    str(sysfs), "--json"], env=env, check=False, timeout=120)
    assert r.returncode == 0, r.stderr
    assert {g["fabric"] for g in json.loads(r.stdout)["gpus"]} == {None}


def test_a_fabric_in_progress_fails_and_keeps_the_node_tainted(tmp_path: Path) -> None:
    """A YAML derived from the mock's H100 profile with `fabric.state: in_progress` (Fabric Manager not
    done, as on gpu-operator #2781's B200): the self-test waits its timeout, then fails with the state
    in each problem; the verdict it publishes is `failed` with those problems, and the cluster side
    keeps (or puts back) the unverified taint."""
    from nodeprep.join.verification import FAILED, SELFTEST_ANNOTATION, reconcile, verdict_patch
    from nodeprep.labels.core import VERIFIED_LABEL
    from nodeprep.node.selftest import Verdict

    data = yaml.safe_load(mocknvml.config("h100").read_text())
    data["device_defaults"]["fabric"]["state"] = "in_progress"  # derived from the H100 profile
    derived = tmp_path / "h100-fabric-in-progress.yaml"
    derived.write_text(yaml.safe_dump(data))
    r = verify(tmp_path, derived, "--fabric-timeout", "1")
    assert r.returncode == 1
    out = json.loads(r.stdout)
    assert {g["fabric"] for g in out["gpus"]} == {"In Progress"}
    assert out["problems"][0] == ("fabric: GPU 0000:1a:00.0 fabric state In Progress (Fabric Manager has not "
                                  "registered it; CUDA fails with error 802 until it has)")
    assert len([p for p in out["problems"] if p.startswith("fabric: ")]) == 8
    verdict = Verdict(passed=False, problems=tuple(out["problems"]), driver_version=DRIVER)
    node_obj = {"metadata": {"name": "hgx-1", "labels": {"nodeprep.dev/driver-version": DRIVER}},
                "status": {"nodeInfo": {"bootID": "b1"}}, "spec": {}}
    patch, published = verdict_patch(node_obj, verdict, "b1")
    assert patch["metadata"]["labels"][VERIFIED_LABEL] == FAILED and not published.passed
    assert "fabric state In Progress" in patch["metadata"]["annotations"][SELFTEST_ANNOTATION]
    after = {**node_obj, "metadata": {**node_obj["metadata"],
                                      "labels": {**node_obj["metadata"]["labels"], VERIFIED_LABEL: FAILED}}}
    taint_patch, reason = reconcile(after)
    assert taint_patch and taint_patch["spec"]["taints"][0]["key"] == "nodeprep.dev/unverified"
    assert reason == "no valid GPU verdict (self-test failed): taint added"



def test_the_profile_says_how_long_to_wait(tmp_path: Path) -> None:
    """driver.fabric_timeout of the node's profile is the wait when no flag says otherwise (the fabric in
    progress: a YAML derived from the mock's H100 profile)."""
    data = yaml.safe_load(mocknvml.config("h100").read_text())
    data["device_defaults"]["fabric"]["state"] = "in_progress"  # derived from the H100 profile
    derived = tmp_path / "h100-fabric-in-progress.yaml"
    derived.write_text(yaml.safe_dump(data))
    prof = tmp_path / "node.yaml"
    prof.write_text(yaml.safe_dump({"driver": {"version": DRIVER, "fabric_timeout": 0}}))
    r = verify(tmp_path, derived, "--profile", str(prof))
    assert r.returncode == 1 and "fabric state In Progress" in r.stderr


def test_a_lost_gpu_fails_the_self_test(tmp_path: Path) -> None:
    """tests/fixtures/mocknvml/h100-gpu-lost.yaml (derived from the mock's H100 profile: GPU 2 lost): NVML
    still lists it, its queries answer NVML_ERROR_GPU_IS_LOST; the self-test names it, the others pass."""
    r = verify(tmp_path, mocknvml.derived("h100-gpu-lost", tmp_path / "profiles"), "--fabric-timeout", "0")
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert out["source"] == "nvml" and len(out["gpus"]) == 8
    lost = "visibility: GPU 0000:4a:00.0 is lost (NVML: GPU is lost; reset or replace it)"
    assert out["problems"] == [lost]
