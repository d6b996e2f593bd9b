"""Real smoke boots: the built kmod artifact on its own Debian kernel and on another one, under
qemu (TCG). No GPU exists here, so a good nvidia.ko must stop at its probe with ENODEV."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from nodeprep import runner
from nodeprep.artifact import LocalStore, read_manifest

pytestmark = pytest.mark.slow


def nodeprep(*args: object, check: bool = False) -> runner.Result:
    return runner.run([sys.executable, "-m", "nodeprep.cli", *args], check=check, timeout=600,
                      env={"PYTHONPATH": str(Path(__file__).resolve().parents[3])})


def test_artifact_passes_on_its_own_kernel(kmod: Path, kernel_release: str, test_cache: Path) -> None:
    res = nodeprep("smoke-test", kmod, "--cache", test_cache, "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["verdict"] == "PASS" and data["passed"] is True
    assert data["kernel_release"] == kernel_release
    assert "NVRM: No NVIDIA GPU found." in data["log_excerpt"].splitlines()
    assert "insmod nvidia: No such device" in data["log_excerpt"].splitlines()
    assert data["modules"]["nvidia"] == "probe: no GPU (ENODEV)"
    for name in ("nvidia_uvm", "nvidia_modeset", "nvidia_drm"):
        assert data["modules"][name].startswith("symbols resolved ("), data["modules"]
    assert "nvidia" in data["modules"]["nvidia_drm"] and "drm_kms_helper" in data["modules"]["nvidia_drm"]


def test_artifact_on_another_kernel_is_refused_then_fails_when_forced(
        kmod: Path, kernel_release: str, other_kernel: str, test_cache: Path) -> None:
    refused = nodeprep("smoke-test", kmod, "--cache", test_cache, "--kernel", other_kernel)
    assert refused.returncode == 2
    assert kernel_release in refused.stderr and other_kernel in refused.stderr

    forced = nodeprep("smoke-test", kmod, "--cache", test_cache, "--kernel", other_kernel, "--force",
                      "--json")
    assert forced.returncode == 1, forced.stderr
    data = json.loads(forced.stdout)
    assert data["verdict"] == "FAIL" and data["kernel_release"] == other_kernel
    assert data["reason"].startswith("nvidia (module under test) failed to load: ")
    kernel_says = ("disagrees about version of symbol", "Unknown symbol", "version magic")
    assert any(k in data["reason"] for k in kernel_says), data["reason"]
    # the excerpt quotes the kernel's own line, e.g. "nvidia: disagrees about version of symbol module_layout"
    quoted = [x for x in data["log_excerpt"].splitlines() if x.startswith("nvidia: ")]
    assert any(k in x for x in quoted for k in kernel_says), data["log_excerpt"]
    assert "No NVIDIA GPU found" not in data["log_excerpt"]


def test_install_refuses_the_artifact_for_another_kernel(kmod: Path, kernel_release: str, other_kernel: str,
                                                         tmp_path: Path) -> None:
    """The install engineer's vermagic check: the node side refuses what the smoke test rejects."""
    store = kmod.parent
    driver = read_manifest(kmod).driver_version
    indexed = (store / "index.json").exists()
    kinds = {(e.kind, e.driver_version) for e in LocalStore(store).entries()} if indexed else set()
    if ("userspace", driver) not in kinds:
        if not os.environ.get("NODEPREP_SMOKE_KMOD"):
            pytest.fail(f"the real build's store {store} has no user-space artifact for {driver}")
        pytest.skip(f"{store} is not a store with {driver}'s user-space artifact (NODEPREP_SMOKE_KMOD)")
    res = nodeprep("install", "--root", tmp_path, "--store", store, "--driver", driver,
                   "--kernel", other_kernel, "--no-load")
    assert res.returncode != 0
    assert kernel_release in res.stderr and other_kernel in res.stderr, res.stderr
    assert not (tmp_path / "opt" / "nvidia" / driver).exists()
