"""The CUDA gate through real podman 4.3 starts, for a GPU that does not come from nodeprep's spec: a
CDI spec in the DRA kubelet plugin's format (kind k8s.gpu.nvidia.com/claim, one device named by the
claim's UID, mounting the active driver's libcuda) written here, and the gate run by podman from the
hooks.d file `nodeprep runtime --root` wrote into the node root (`--hooks-dir`). The node's driver
is the active version (the real 535.309.01 build: CUDA 12.2); the GPU facts are recorded facts
written to the node's facts file (a Tesla T4, a GeForce RTX 3090), not a live GPU (gpunode.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nodeprep.containerhooks import gate
from nodeprep.runtime import ocihooks

from .gpunode import PODMAN_SANDBOX, GpuNode, cli, make_rootfs_tar, unpack_rootfs

pytestmark = pytest.mark.slow

CLAIM_UID = "0f6b9c2e-3a41-4d7e-9c55-2b8e1d7a6f10"
DRA_KIND = "k8s.gpu.nvidia.com/claim"
TESLA = {"gpus": [{"brand": "tesla", "arch": "7.5", "name": "Tesla T4"}]}
GEFORCE = {"gpus": [{"brand": "geforce", "arch": "8.6", "name": "NVIDIA GeForce RTX 3090"}]}
COMPAT = "575.51.03"  # CUDA 12.9's driver: newer than the node's 535.309.01


def dra_spec(version: str) -> dict:  # type: ignore[type-arg]
    """A claim's CDI spec as the DRA kubelet plugin writes one (cdi.go): nothing of nodeprep in it."""
    lib = f"/opt/nvidia/{version}/lib64/libcuda.so.{version}"
    return {
        "cdiVersion": "0.5.0",
        "kind": DRA_KIND,
        "devices": [{"name": CLAIM_UID, "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [{"path": "/dev/nvidia0"}, {"path": "/dev/nvidiactl"}],
        }}],
        "containerEdits": {"mounts": [
            {"hostPath": lib, "containerPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
             "options": ["ro", "nosuid", "nodev", "bind"]},
        ]},
    }


@pytest.fixture
def claim(gpu_node: GpuNode, versions: tuple[str, str]) -> Iterator[Path]:
    """The claim's spec in the node's CDI directory; removed (with any facts file) afterwards."""
    spec = gpu_node.root / "etc/cdi" / f"k8s.gpu.nvidia.com-claim_{CLAIM_UID}.json"
    spec.write_text(json.dumps(dra_spec(versions[0])))
    facts = gpu_node.root / gate.FACTS.lstrip("/")
    try:
        yield facts
    finally:
        spec.unlink(missing_ok=True)
        facts.unlink(missing_ok=True)


def start(node: GpuNode, rootfs: Path, env: dict[str, str], *, gpu: bool = True,
          script: str = "echo started") -> subprocess.CompletedProcess[str]:
    hooks_dir = node.root / ocihooks.HOOKS_DIR.lstrip("/")
    argv: list[object] = [*node.podman_base(), "--hooks-dir", hooks_dir, "run", "--rm", "--network", "none",
                          *PODMAN_SANDBOX]
    argv += ["--device", f"{DRA_KIND}={CLAIM_UID}"] if gpu else []
    for k, v in env.items():
        argv += ["--env", f"{k}={v}"]
    return node.ns([*argv, "--rootfs", rootfs, "sh", "-c", script], check=False)


def refused_line(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode != 0 and "started" not in r.stdout, (r.stdout, r.stderr)
    lines = [line for line in r.stderr.splitlines() if "nodeprep: container refused:" in line]
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_gate_allows_refuses_bypasses_a_dra_claim_container(
    gpu_node: GpuNode, versions: tuple[str, str], claim: Path
) -> None:
    claim.write_text(json.dumps(TESLA))
    rootfs = gpu_node.rootfs["debian"]
    need = {"NVIDIA_REQUIRE_CUDA": "cuda>=12.2"}
    ok = start(gpu_node, rootfs, need, script="ls /dev/nvidia0; echo started")
    assert ok.returncode == 0 and ok.stdout.split() == ["/dev/nvidia0", "started"], ok.stderr
    line = refused_line(start(gpu_node, rootfs, {"NVIDIA_REQUIRE_CUDA": "cuda>=99.0"}))
    assert (f"NVIDIA_REQUIRE_CUDA requires CUDA >=99.0, but driver {versions[0]} supports up to CUDA 12.2 "
            "(set NVIDIA_DISABLE_REQUIRE=1 to skip the check)") in line
    bypassed = start(gpu_node, rootfs, {"NVIDIA_REQUIRE_CUDA": "cuda>=99.0", "NVIDIA_DISABLE_REQUIRE": "1"})
    assert bypassed.returncode == 0 and bypassed.stdout.strip() == "started", bypassed.stderr
    # a container without a GPU is untouched, whatever it requires
    plain = start(gpu_node, rootfs, {"NVIDIA_REQUIRE_CUDA": "cuda>=99.0"}, gpu=False)
    assert plain.returncode == 0 and plain.stdout.strip() == "started", plain.stderr


def compat_rootfs(node: GpuNode, versions: tuple[str, str], cdi_cache: Path) -> Path:
    """An image with CUDA 12.9's forward-compatibility libcuda (a real libcuda.so.1 under the compat
    package's file name), made once per session; its compat ld.so.conf.d entry removed."""
    rootfs = node.work / "rootfs-gate-compat"
    if not rootfs.is_dir():
        unpack_rootfs(make_rootfs_tar(cdi_cache), rootfs, node.work / "probe", layout="debian")
        compat = rootfs / "usr/local/cuda/compat"
        compat.mkdir(parents=True)
        shutil.copy(node.root / f"opt/nvidia/{versions[1]}/lib64/libcuda.so.{versions[1]}",
                    compat / f"libcuda.so.{COMPAT}")
    (rootfs / "etc/ld.so.conf.d" / gate.COMPAT_CONF).unlink(missing_ok=True)
    return rootfs


def test_gate_forward_compat_only_on_data_center_gpus(
    gpu_node: GpuNode, versions: tuple[str, str], claim: Path, cdi_cache: Path
) -> None:
    """An image with CUDA 12.9's forward-compatibility libcuda (a real libcuda.so.1 under the compat
    package's file name) on a node whose driver supports CUDA 12.2."""
    rootfs = compat_rootfs(gpu_node, versions, cdi_cache)
    conf = rootfs / "etc/ld.so.conf.d" / gate.COMPAT_CONF
    need = {"NVIDIA_REQUIRE_CUDA": "cuda>=12.9"}
    # GeForce: refused, the compat library left alone (it would fail with CUDA error 804)
    claim.write_text(json.dumps(GEFORCE))
    line = refused_line(start(gpu_node, rootfs, need))
    assert f"forward-compatibility libcuda {COMPAT} is not used: GPU brand geforce" in line
    assert not conf.exists()
    # Tesla: allowed, and the image's loader takes the compat library (first in its ld cache)
    claim.write_text(json.dumps(TESLA))
    ok = start(gpu_node, rootfs, need, script="ldconfig -p | grep 'libcuda.so.1 '; echo started")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines()[0].endswith("=> /usr/local/cuda/compat/libcuda.so.1"), ok.stdout
    assert ok.stdout.splitlines()[-1] == "started"
    assert conf.read_text() == "/usr/local/cuda/compat\n"


@pytest.fixture
def pci_gpu(gpu_node: GpuNode) -> Iterator[Callable[[str], None]]:
    """Puts one NVIDIA GPU (PCI device id) under the node root's /sys, where an activation under
    --root reads the GPUs; the tree is removed afterwards."""
    bus = gpu_node.root / "sys/bus"  # the image's /sys is an empty folder
    assert not bus.exists()

    def put(device: str) -> None:
        shutil.rmtree(bus, ignore_errors=True)
        dev = bus / "pci/devices/0000:00:1e.0"
        dev.mkdir(parents=True)
        for attr, value in (("vendor", "0x10de"), ("device", f"0x{device}"), ("class", "0x030200")):
            (dev / attr).write_text(value + "\n")

    try:
        yield put
    finally:
        shutil.rmtree(bus, ignore_errors=True)


def test_gate_compat_follows_the_facts_activation_records(
    gpu_node: GpuNode, versions: tuple[str, str], claim: Path, cdi_cache: Path,
    pci_gpu: Callable[[str], None],
) -> None:
    """No facts written by hand: `nodeprep activate --root` records them from the node's GPUs (a
    Tesla T4, 10de:1eb8; a GeForce RTX 3090, 10de:2204), and the gate podman runs reads them."""
    rootfs = compat_rootfs(gpu_node, versions, cdi_cache)
    conf = rootfs / "etc/ld.so.conf.d" / gate.COMPAT_CONF
    need = {"NVIDIA_REQUIRE_CUDA": "cuda>=12.9"}
    assert not claim.exists()
    # no facts at all: a plain CUDA check still holds against the driver, compat is refused
    ok = start(gpu_node, rootfs, {"NVIDIA_REQUIRE_CUDA": "cuda>=12.2"})
    assert ok.returncode == 0 and ok.stdout.strip() == "started", ok.stderr
    assert "GPU brand unknown does not support" in refused_line(start(gpu_node, rootfs, need))
    pci_gpu("1eb8")
    r = cli("activate", versions[0], "--root", str(gpu_node.root), "--no-load")
    assert r.returncode == 0, r.stderr
    assert json.loads(claim.read_text())["gpus"][0]["brand"] == "tesla"
    ok = start(gpu_node, rootfs, need, script="ldconfig -p | grep 'libcuda.so.1 '; echo started")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines()[0].endswith("=> /usr/local/cuda/compat/libcuda.so.1"), ok.stdout
    conf.unlink()
    pci_gpu("2204")
    r = cli("activate", versions[0], "--root", str(gpu_node.root), "--no-load")
    assert r.returncode == 0, r.stderr
    line = refused_line(start(gpu_node, rootfs, need))
    assert f"forward-compatibility libcuda {COMPAT} is not used: GPU brand geforcertx" in line
    assert not conf.exists()
