"""Doctor checks and report formatting.

Stand-ins at the kernel boundary: ROOT/sys/module/nvidia/version, ROOT/proc/driver/nvidia/version and
ROOT/sys/bus/pci/devices/*/{vendor,class} are written as files with the content the kernel exposes
(no GPU here). The NVRM line is the driver's real format; the versions are those of our artifacts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nodeprep.errors import InputError
from nodeprep.node.doctor import doctor, loaded_version


def fake_version(root: Path, version: str) -> None:
    vdir = root / "opt/nvidia" / version
    (vdir / "modules/6.1.0-28-amd64").mkdir(parents=True)
    (vdir / "manifest.json").write_text(json.dumps({"kind": "userspace"}))
    (vdir / "modules/6.1.0-28-amd64/manifest.json").write_text(json.dumps({"kind": "kmod"}))


NVRM = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.216.03  Wed Oct 30 19:06:27 UTC 2024\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
)


def gpu(root: Path, bus: str = "0000:00:1e.0") -> None:
    d = root / "sys/bus/pci/devices" / bus
    d.mkdir(parents=True)
    (d / "vendor").write_text("0x10de\n")
    (d / "class").write_text("0x030200\n")


def active_root(root: Path, version: str = "535.309.01") -> Path:
    fake_version(root, version)
    os.symlink(version, root / "opt/nvidia/current")
    return root


def by_name(report) -> dict:  # type: ignore[no-untyped-def]
    return {c.name: c for c in report.checks}


def test_loaded_version_sources(tmp_path: Path) -> None:
    assert loaded_version(tmp_path) is None
    (tmp_path / "proc/driver/nvidia").mkdir(parents=True)
    (tmp_path / "proc/driver/nvidia/version").write_text(NVRM)
    assert loaded_version(tmp_path) == "535.216.03"
    (tmp_path / "sys/module/nvidia").mkdir(parents=True)
    (tmp_path / "sys/module/nvidia/version").write_text("535.309.01\n")
    assert loaded_version(tmp_path) == "535.309.01"


def test_no_gpu_is_reported_distinctly(tmp_path: Path) -> None:
    report = doctor(active_root(tmp_path), checks={"gpu", "module", "devices"})
    checks = by_name(report)
    assert not report.ok
    assert not checks["gpu"].ok and "no NVIDIA GPU" in checks["gpu"].message
    assert checks["module"].ok and checks["module"].skipped and "no GPU" in checks["module"].message
    assert checks["devices"].skipped


def test_gpu_without_driver(tmp_path: Path) -> None:
    gpu(tmp_path)
    report = doctor(active_root(tmp_path), checks={"gpu", "module"})
    checks = by_name(report)
    assert checks["gpu"].ok and "0000:00:1e.0" in checks["gpu"].message
    assert not checks["module"].ok and "not loaded" in checks["module"].message


def test_version_mismatch_names_the_error_and_the_fix(tmp_path: Path) -> None:
    gpu(tmp_path)
    active_root(tmp_path, "535.309.01")
    (tmp_path / "proc/driver/nvidia").mkdir(parents=True)
    (tmp_path / "proc/driver/nvidia/version").write_text(NVRM)
    report = doctor(tmp_path, checks={"module"})
    msg = report.checks[0].message
    assert not report.ok
    assert "535.216.03" in msg and "535.309.01" in msg and "Driver/library version mismatch" in msg
    assert "systemctl restart nodeprep-nvidia" in msg and "nodeprep activate 535.216.03" in msg


def test_matching_module_and_missing_devices(tmp_path: Path) -> None:
    gpu(tmp_path)
    active_root(tmp_path, "535.216.03")
    (tmp_path / "proc/driver/nvidia/gpus/0000:00:1e.0").mkdir(parents=True)
    (tmp_path / "proc/driver/nvidia/version").write_text(NVRM)
    (tmp_path / "proc/driver/nvidia/gpus/0000:00:1e.0/information").write_text("Device Minor: \t 0\n")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/nvidiactl").touch()
    report = doctor(tmp_path, checks={"module", "devices"})
    checks = by_name(report)
    assert checks["module"].ok
    assert not checks["devices"].ok
    assert "/dev/nvidia0" in checks["devices"].message and "/dev/nvidiactl" not in checks["devices"].message


def test_ldcache_missing_and_cuda(tmp_path: Path) -> None:
    active_root(tmp_path, "535.216.03")
    report = doctor(tmp_path, checks={"ldcache"}, require_cuda="12.4")
    checks = by_name(report)
    assert not checks["ldcache"].ok and "libcuda.so.1 is not in the ld cache" in checks["ldcache"].message
    assert not checks["cuda"].ok and "550.54.14" in checks["cuda"].message


def test_nothing_installed(tmp_path: Path) -> None:
    report = doctor(tmp_path, checks={"state", "ldcache"}, require_cuda="12.2")
    assert [c.ok for c in report.checks] == [False, False, False]
    assert "no NVIDIA driver installed" in report.checks[0].message


def test_render_and_dict(tmp_path: Path) -> None:
    report = doctor(active_root(tmp_path), checks={"state", "gpu", "module"})
    lines = report.render().splitlines()
    assert lines == [
        "ok   state: active 535.309.01; installed: 535.309.01",
        "FAIL gpu: no NVIDIA GPU on this node (no PCI device with vendor 10de)",
        "skip module: no driver loaded (no GPU)",
    ]
    data = json.loads(json.dumps(report.to_dict()))
    assert data["ok"] is False and data["active"] == "535.309.01"
    assert data["checks"][1] == {
        "name": "gpu",
        "ok": False,
        "skipped": False,
        "message": "no NVIDIA GPU on this node (no PCI device with vendor 10de)",
    }


def test_unknown_check(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown check"):
        doctor(tmp_path, checks={"bogus"})
