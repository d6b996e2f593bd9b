"""playbooks/upgrade-driver.yml for real against three test hosts: a rolling upgrade (serial 1,
max_fail_percentage 0) where the second host's artifact is corrupted. The first batch upgrades, the
second fails on the checksum and keeps its old driver, the third is never touched. No GPU, nothing
GPU-like: upgrade_gpu_selftest is off (the doctor gate validates); the self-test's path runs on NVIDIA's
NVML mock in tests/slow/fleet/test_upgrade_cluster.py."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.support import testhosts

from .conftest import IMAGE_ROOT, Store, fleet_vars, write_inventory

pytestmark = pytest.mark.slow
NO_SELFTEST = {"upgrade_gpu_selftest": False}


def _state(host: testhosts.TestHost) -> dict[str, object]:
    path = host.root / IMAGE_ROOT.lstrip("/") / "var/lib/nodeprep/state.json"
    return json.loads(path.read_text())


def _corrupt_copy(good: Path, bad: Path, victim: str) -> None:
    """`bad` is `good` with one artifact's bytes changed (its index entry, and so its sha256, kept)."""
    bad.mkdir()
    for item in good.iterdir():
        if item.is_file() and not item.name.startswith("."):
            if item.name == victim:
                data = bytearray(item.read_bytes())
                for i in range(len(data) // 2, len(data) // 2 + 64):
                    data[i] ^= 0xFF
                (bad / item.name).write_bytes(bytes(data))
            else:
                os.link(item, bad / item.name) if item.stat().st_dev == bad.stat().st_dev else shutil.copy(
                    item, bad
                )


def test_failed_batch_stops_the_rollout(
    fleet3: testhosts.Fleet, upgrade_store: Store, source_snapshot: Path, tmp_path: Path
) -> None:
    old, new = upgrade_store.versions
    kernel = upgrade_store.kernel
    served = tmp_path / "served"
    served.mkdir()
    (served / "good").symlink_to(upgrade_store.path)
    _corrupt_copy(upgrade_store.path, served / "bad", f"nvidia-userspace-{new}-amd64.tar.zst")
    node1, node2, node3 = fleet3.hosts
    with testhosts.serve_directory(served, fleet3) as urls:
        host_vars = {
            h.name: {"nvidia_driver_store": urls[h.name] + ("/bad" if h is node2 else "/good")}
            for h in fleet3.hosts
        }
        group_vars = fleet_vars(tmp_path, source_snapshot, old, kernel)
        inventory = write_inventory(fleet3, tmp_path / "inventory.yml", group_vars, host_vars)

        first = testhosts.ansible_playbook(
            fleet3, "playbooks/upgrade-driver.yml", inventory, extra_vars=NO_SELFTEST
        )
        assert first.returncode == 0, first.output[-6000:]
        assert all(_state(h)["active"] == old for h in fleet3.hosts)

        upgrade = testhosts.ansible_playbook(
            fleet3,
            "playbooks/upgrade-driver.yml",
            inventory,
            extra_vars={**NO_SELFTEST, "nvidia_driver_version": new},
        )
    assert upgrade.returncode != 0, upgrade.output[-6000:]
    print("install run:", first.recap, "\nupgrade run:", upgrade.recap)
    assert "does not match" in upgrade.output or "sha256" in upgrade.output, upgrade.output[-4000:]
    recap = upgrade.recap
    assert recap["node1"]["failed"] == 0 and recap["node1"]["changed"] > 0, recap
    assert recap["node2"]["failed"] == 1, recap
    assert recap.get("node3", {}).get("ok", 0) == 0, recap  # later batch never started

    assert _state(node1)["active"] == new
    image = lambda h: h.root / IMAGE_ROOT.lstrip("/")  # noqa: E731
    assert os.readlink(image(node1) / "opt/nvidia/current") == new
    for host in (node2, node3):
        assert _state(host)["active"] == old, host.name
        assert new not in _state(host)["installed"], host.name
        assert os.readlink(image(host) / "opt/nvidia/current") == old
        assert not (image(host) / "opt/nvidia" / new).exists()
