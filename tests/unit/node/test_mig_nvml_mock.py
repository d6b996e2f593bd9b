"""`nodeprep mig`, and MIG in `bootstrap` and `labels`, through NVIDIA's NVML mock (no GPU: every
command runs with the mock's libnvidia-ml on LD_LIBRARY_PATH and one of its profiles, the HGX H100
and the derived ones of tests/fixtures/mocknvml; each test first checks that NVML's GPUs are the
mock's, so nothing here can reach a real GPU's MIG).

What the mock allows: MIG mode read (current and pending, from the profile's device_defaults); it
lists no GPU instance profiles and no instances, and nvmlDeviceSetMigMode / instance creation answer
Not Supported (its README). So the layouts that are in place (MIG off everywhere, MIG on with no MIG
devices, MIG on pending a reset) are planned as nothing to do and recorded `success`/`pending`; a
layout that needs MIG mode changed reaches NVML's nvmlDeviceSetMigMode and is recorded `failed` with
the mock's answer; a layout with MIG devices is refused before NVML is touched (the GPU offers no
profile). Creating GPU and compute instances is not exercised: the mock has none.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import mocknvml
from tests.support.fixtures import NVIDIA_SMI, REPO

CONFIGS = {"version": "v1", "mig-configs": {
    "all-disabled": [{"devices": "all", "mig-enabled": False}],
    "all-enabled": [{"devices": "all", "mig-enabled": True, "mig-devices": {}}],
    "all-1g.10gb": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}],
}}
MOCK_UUIDS = [f"GPU-01000100-0000-0000-0000-00000000000{i}" for i in range(8)]


@pytest.fixture(autouse=True)
def mock_only() -> None:
    reason = mocknvml.skip_reason()
    if reason:
        pytest.skip(reason)


def node_root(tmp_path: Path, select: str, **labels: str) -> Path:
    root = tmp_path / "root"
    (root / "etc/nodeprep").mkdir(parents=True, exist_ok=True)
    (root / "etc/nodeprep/node.yaml").write_text(yaml.safe_dump({
        "driver": {"version": "550.163.01"}, "labels": {"cloud": "none", **labels},
        "mig": {"config": CONFIGS, "select": select}}))
    return root


def nodeprep(cache: Path, machine: str, *args: str, work: Path) -> subprocess.CompletedProcess[str]:
    profile = mocknvml.config(machine) if machine in mocknvml.MACHINES else mocknvml.derived(machine, work)
    env = mocknvml.env(cache, profile, {**os.environ, "PYTHONPATH": str(REPO)})
    return subprocess.run([sys.executable, "-m", "nodeprep.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=env)


def mig(cache: Path, machine: str, root: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    done = nodeprep(cache, machine, "mig", "--root", str(root), "--json", *args, work=root.parent)
    return done.returncode, json.loads(done.stdout) if done.stdout else {}, done.stderr


def checked(cache: Path, machine: str, root: Path) -> dict[str, Any]:
    """The plan, read first: the GPUs must be the mock's before anything may be applied."""
    code, plan, err = mig(cache, machine, root, "--check")
    assert code == 0, err
    assert [g["uuid"] for g in plan["gpus"]] == MOCK_UUIDS
    return plan


def state(root: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((root / "var/lib/nodeprep/mig.json").read_text())
    return data


def test_in_place_layouts_change_nothing_and_say_success(test_cache: Path, tmp_path: Path) -> None:
    root = node_root(tmp_path, "all-disabled")
    plan = checked(test_cache, "h100", root)
    assert plan["changes"] is False and plan["summary"] == "MIG config all-disabled: in place"
    assert not (root / "var/lib/nodeprep/mig.json").exists()  # --check writes nothing
    code, out, err = mig(test_cache, "h100", root)
    assert code == 0, err
    assert out["summary"] == "MIG config all-disabled: success (in place, nothing changed)"
    assert state(root) == {"config": "all-disabled", "state": "success", "done": [], "error": None,
                           "layout": []}
    again = nodeprep(test_cache, "h100", "mig", "--root", str(root), work=tmp_path)
    assert again.returncode == 0 and again.stdout.splitlines()[-1] == out["summary"]  # idempotent
    gone = nodeprep(test_cache, "h100", "uninstall", "--root", str(root), work=tmp_path)
    assert gone.returncode == 0, gone.stderr
    assert not (root / "var/lib/nodeprep/mig.json").exists()  # uninstall takes the record away

    root = node_root(tmp_path / "on", "all-enabled")
    checked(test_cache, "h100-mig-enabled", root)
    code, out, err = mig(test_cache, "h100-mig-enabled", root)
    assert code == 0 and state(root)["state"] == "success", err
    # the record names each MIG-enabled GPU and the MIG devices it has (the mock has none)
    assert state(root)["layout"] == [{"index": i, "uuid": u, "mig_devices": []}
                                     for i, u in enumerate(MOCK_UUIDS)]


def test_a_mode_change_reaches_nvml_and_is_recorded_failed(test_cache: Path, tmp_path: Path) -> None:
    root = node_root(tmp_path, "all-disabled")
    plan = checked(test_cache, "h100-mig-enabled", root)
    assert plan["changes"] is True and plan["summary"] == "would apply MIG config all-disabled"
    shown = nodeprep(test_cache, "h100-mig-enabled", "mig", "--root", str(root), "--check", work=tmp_path)
    assert shown.stdout.splitlines()[0] == "would: GPU 0 (NVIDIA H100 80GB HBM3): disable MIG mode"
    code, _, err = mig(test_cache, "h100-mig-enabled", root)
    assert code == 1
    assert [ln for ln in err.splitlines() if ln.startswith("error:")] == [
        "error: MIG config all-disabled: GPU 0 (NVIDIA H100 80GB HBM3): nvmlDeviceSetMigMode: Not Supported"]
    assert state(root)["state"] == "failed"


def test_a_layout_the_gpus_do_not_offer_is_refused_before_nvml(test_cache: Path, tmp_path: Path) -> None:
    root = node_root(tmp_path, "all-1g.10gb")
    code, out, err = mig(test_cache, "h100-mig-enabled", root, "--check")
    assert code == 2 and out == {}
    lines = err.splitlines()
    assert lines == [
        "error: mig.config: mig-configs.all-1g.10gb[0]: GPU 0, 1, 2, 3, 4, 5, 6, 7 (NVIDIA H100 80GB HBM3): "
        "MIG profile 1g.10gb not offered (it offers none)"]
    assert mig(test_cache, "h100-mig-enabled", root)[0] == 2
    assert not (root / "var/lib/nodeprep").exists()


def test_pending_mode_and_the_labels(test_cache: Path, tmp_path: Path) -> None:
    """MIG enabled but pending a GPU reset (the derived A100 profile): in place, state `pending`;
    `labels` then carry mig-manager's nvidia.com/mig.config and nvidia.com/mig.config.state."""
    root = node_root(tmp_path, "all-enabled", mig_strategy="single")
    code, out, err = mig(test_cache, "a100-mig-pending", root)
    assert code == 0, err
    assert out["summary"] == "MIG config all-enabled: pending (in place, nothing changed)"
    assert out["plan"][0] == ("GPU 0 (NVIDIA A100-SXM4-40GB): in place: MIG enabled (takes effect at the "
                              "next GPU reset)")
    (tmp_path / "sys/module/nvidia").mkdir(parents=True)
    done = nodeprep(test_cache, "a100-mig-pending", "labels", "--root", str(root), "--source", "nvml",
                    "--sysfs-root", str(tmp_path / "sys"), "--json", work=tmp_path)
    assert done.returncode == 0, done.stderr
    labels = json.loads(done.stdout)["labels"]
    assert labels["nvidia.com/mig.config"] == "all-enabled"
    assert labels["nvidia.com/mig.config.state"] == "pending"
    assert labels["nvidia.com/mig.strategy"] == "single"  # labels.mig_strategy from the profile


def test_bootstrap_puts_the_layout_in_place_before_the_labels(test_cache: Path, tmp_path: Path) -> None:
    """`bootstrap --mig` on a root (the driver from a store of small real artifacts, GPU facts for the
    labels from a capture, NVML from the mock): the mig step runs after modules and before labels,
    and the labels it writes carry the outcome."""
    from tests.support.standin import KERNEL, standin_image_root

    store, root = standin_image_root(tmp_path)
    profile = root / "etc/nodeprep/node.yaml"
    profile.write_text(yaml.safe_dump({
        "driver": {"version": "535.309.01", "store": str(store), "kernel": KERNEL},
        "labels": {"cloud": "none"}, "mig": {"config": CONFIGS, "select": "all-disabled"}}))
    args = ("bootstrap", "--root", str(root), "--mig", "--nvidia-smi-xml",
            str(NVIDIA_SMI / "a100-sxm4-80gb-mig_535.54.03.xml"))
    planned = nodeprep(test_cache, "h100", *args, "--check", "--json", work=tmp_path)
    assert planned.returncode == 0, planned.stderr
    steps = json.loads(planned.stdout)["steps"]
    assert [s["name"] for s in steps][:4] == ["driver", "modules", "mig", "labels"]
    assert steps[2]["result"]["summary"] == "MIG config all-disabled: in place"
    done = nodeprep(test_cache, "h100", *args, work=tmp_path)
    assert done.returncode == 0, done.stderr
    journal = [ln for ln in done.stderr.splitlines() if ln.startswith("bootstrap: ")]
    assert journal[2].startswith("bootstrap: mig: done in ") and journal[2].endswith(
        "(MIG config all-disabled: success (in place, nothing changed))")
    assert journal[3].startswith("bootstrap: labels: done in ")
    labels = json.loads((root / "etc/nodeprep/labels.json").read_text())
    assert labels["nvidia.com/mig.config.state"] == "success"
    assert labels["nvidia.com/mig.config"] == "all-disabled"
