"""The GPU support check on real installs: the node store's user-space artifacts are built from
Debian's real packages (so they carry NVIDIA's real supported-gpus.json of 535.309.01) and the
node's GPUs are a PCI sysfs tree under --root made from real device ids (10de:2b85 Blackwell,
10de:2330 H100 SXM)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import V_NEW, NodeStore, cli

pytestmark = pytest.mark.slow


def gpu(root: Path, device: str) -> None:
    d = root / "sys" / "bus" / "pci" / "devices" / "0000:1b:00.0"
    d.mkdir(parents=True, exist_ok=True)
    for k, v in (("vendor", "0x10de"), ("device", f"0x{device}"), ("class", "0x030200")):
        (d / k).write_text(v + "\n")


def tree(root: Path) -> list[str]:
    """Every path under `root` but the test's own sysfs tree."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.relative_to(root).parts[0] != "sys")


def test_install_refuses_a_gpu_newer_than_the_driver_before_anything_changes(
    node_store: NodeStore, rootfs: Path
) -> None:
    gpu(rootfs, "2b85")
    before = tree(rootfs)
    r = cli("install", "--store", str(node_store.path), "--driver", V_NEW, "--kernel", node_store.kernel,
            "--root", str(rootfs), "--activate")
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: NVIDIA device 10de:2b85 (PCI 10de:2b85) is newer than 535.309.01")
    assert tree(rootfs) == before


def test_supported_gpu_installs_and_activate_rechecks(node_store: NodeStore, rootfs: Path) -> None:
    gpu(rootfs, "2330")
    r = cli("install", "--store", str(node_store.path), "--driver", V_NEW, "--kernel", node_store.kernel,
            "--root", str(rootfs))
    assert r.returncode == 0, r.stderr
    assert (rootfs / "opt/nvidia" / V_NEW / "share/supported-gpus.json").is_file()
    gpu(rootfs, "2b85")  # the node's GPU changed: activation refuses
    before = tree(rootfs)
    r = cli("activate", V_NEW, "--root", str(rootfs))
    assert r.returncode == 2 and "(PCI 10de:2b85) is newer than 535.309.01" in r.stderr
    assert tree(rootfs) == before and not (rootfs / "opt/nvidia/current").exists()
