"""`nodeprep health --json` as a real process against NVIDIA's NVML mock (tests/support/mocknvml.py:
8-GPU H100/B200/GB200 profiles, the mock's `example-h100-faults`, and override files in
tests/fixtures/mocknvml derived from its configs), plus a recorded-format kmsg file for the Xids NVML
does not deliver. No GPU: every answer is the mock's."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import mocknvml

pytestmark = pytest.mark.skipif(mocknvml.skip_reason() is not None, reason=str(mocknvml.skip_reason()))

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests/fixtures/mocknvml"


def health(cache: Path, machine: str | Path, *args: str,
           overrides: Path | None = None) -> tuple[int, dict[str, Any]]:
    env = mocknvml.env(cache, machine)
    if overrides is not None:
        env["MOCK_NVML_OVERRIDES"] = str(overrides)
    r = subprocess.run([sys.executable, "-m", "nodeprep.cli", "health", "--json", *args], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def unhealthy(result: dict[str, Any]) -> dict[int, tuple[str, list[str]]]:
    return {g["index"]: (g["action"], [f["reason"] for f in g["findings"]]) for g in result["gpus"]
            if not g["healthy"]}


@pytest.mark.parametrize("machine", ["h100", "b200", "gb200"])
def test_healthy_profiles(test_cache: Path, machine: str) -> None:
    code, out = health(test_cache, machine, "--no-kmsg")
    assert code == 0 and out["healthy"] and out["taint"] is False
    assert out["condition"] == {"type": "GPUHealthy", "status": "True", "reason": "GPUsHealthy",
                                "message": "all 8 GPUs healthy"}
    assert len(out["gpus"]) == 8 and all(g["healthy"] for g in out["gpus"])
    assert out["gpus"][0]["observed"]["ecc_uncorrected_volatile"] == 0


def test_example_h100_faults(test_cache: Path) -> None:
    """The mock's faults: GPU 1 uncorrectable ECC with Xid 48 (its row remapping failed too), GPU 2
    lost, GPU 3 fallen off the bus with Xid 79 (both through the event set); exit 1."""
    code, out = health(test_cache, "example-h100-faults", "--no-kmsg")
    assert code == 1 and not out["healthy"] and out["taint"] is True
    bad = unhealthy(out)
    assert sorted(bad) == [1, 2, 3]
    assert bad[1][0] == "replace" and {"XID48", "ECCUncorrected", "RowRemapFailure"} <= set(bad[1][1])
    assert bad[2] == ("reboot", ["GPULost"])
    assert bad[3] == ("reboot", ["GPULost", "XID79"])
    cond = out["condition"]
    assert cond["status"] == "False" and cond["reason"] == "RowRemapFailure"
    assert "GPU 3 (GPU-01000100-0000-0000-0000-000000000003, 00000000:4B:00.0): NVML cannot reach the GPU" \
        in cond["message"]
    assert "Xid 79 GPU has fallen off the bus" in cond["message"]
    assert out["action"] == "replace"


def test_pending_row_remap(test_cache: Path) -> None:
    code, out = health(test_cache, "h100", "--no-kmsg", overrides=FIXTURES / "remap-pending.yaml")
    assert code == 1 and unhealthy(out) == {5: ("reset", ["RowRemapPending"])}
    assert out["condition"]["reason"] == "RowRemapPending"


def test_fabric_not_completed(test_cache: Path) -> None:
    code, out = health(test_cache, "gb200", "--no-kmsg", overrides=FIXTURES / "fabric-in-progress.yaml")
    assert code == 1 and unhealthy(out) == {6: ("reset", ["FabricNotReady"])}
    assert "fabric state IN_PROGRESS, not COMPLETED" in out["condition"]["message"]


def test_kernel_xid_lines_name_the_gpu_by_pci_address(test_cache: Path, tmp_path: Path) -> None:
    """A kmsg file of records (the /dev/kmsg format, timestamps on this boot's monotonic clock): a GSP
    timeout on 0000:8a:00 (GPU 4 of the H100 profile) counts; an older one, out of the window, and an
    application Xid do not."""
    now_us = int(time.monotonic() * 1e6)
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        f"3,10,{now_us - 120_000_000},-;NVRM: Xid (PCI:0000:8b:00): 79, pid=1, GPU has fallen off the bus."
        "\n"
        f"3,11,{now_us - 1_000_000},-;NVRM: Xid (PCI:0000:8a:00): 119, pid='N/A', Timeout waiting for RPC "
        "from GSP\n"
        f"3,12,{now_us - 500_000},-;NVRM: Xid (PCI:0000:1a:00): 13, Graphics SM Warp Exception\n")
    code, out = health(test_cache, "h100", "--kmsg", str(kmsg), "--xid-window", "60")
    assert code == 1 and unhealthy(out) == {4: ("reset", ["XID119"])}
    assert out["condition"]["reason"] == "XID119"
    assert out["gpus"][0]["findings"][0]["reason"] == "XID13" and out["gpus"][0]["healthy"]


def test_no_nvml_is_unhealthy_not_a_crash(tmp_path: Path) -> None:
    """Without the library (no driver): one answer, NVMLUnavailable, exit 1."""
    r = subprocess.run([sys.executable, "-m", "nodeprep.cli", "health", "--json", "--no-kmsg"], cwd=REPO,
                       env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(tmp_path)}, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert json.loads(r.stdout)["condition"]["reason"] == "NVMLUnavailable"


def test_bad_input_is_exit_2(test_cache: Path, tmp_path: Path) -> None:
    env = mocknvml.env(test_cache, "h100")
    r = subprocess.run([sys.executable, "-m", "nodeprep.cli", "health", "--apply", "--kubeconfig",
                        str(tmp_path / "missing.conf")], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("error: --kubeconfig") and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "nodeprep.cli", "health", "--hold", "-1"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "error:" in r.stderr


def test_mig_mode_without_mig_devices(test_cache: Path, tmp_path: Path) -> None:
    """The mock's H100 profile with MIG mode on (its `device_defaults.mig` block, written here): NVML
    says MIG is enabled but the mock simulates no MIG devices (`nvmlDeviceGetMigDeviceHandleByIndex`
    NOT_FOUND), so there are none to list; the GPUs stay healthy and nothing breaks. That MIG devices
    carry their parent's verdict is tested on the pure core (test_verdict.py)."""
    import yaml

    profile = yaml.safe_load(mocknvml.config("h100").read_text())
    profile["device_defaults"]["mig"].update(mode_current="enabled", mode_pending="enabled")
    path = tmp_path / "h100-mig.yaml"
    path.write_text(yaml.safe_dump(profile))
    code, out = health(test_cache, path, "--no-kmsg")
    assert code == 0 and out["healthy"] and [g["mig_devices"] for g in out["gpus"]] == [[]] * 8
