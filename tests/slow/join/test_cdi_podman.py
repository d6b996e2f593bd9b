"""Containers started by podman 4.3 (Debian 12) through the CDI spec nodeprep wrote for a node root
with the real 535 user space installed and activated (fixtures: conftest.py; what is real and what
stands in for the GPU: gpunode.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .gpunode import GPU_UUID, INSPECT, GpuNode, Seen, file_id

pytestmark = pytest.mark.slow

LIB_DIR = "/usr/lib/x86_64-linux-gnu"


def active_files(node: GpuNode, version: str) -> dict[str, str]:
    lib = node.root / "opt/nvidia" / version / "lib64"
    return {name: file_id(lib / f"{name.rsplit('.so', 1)[0]}.so.{version}")
            for name in ("libcuda.so.1", "libnvidia-ml.so.1")}


def assert_sees(seen: Seen, node: GpuNode, version: str) -> None:
    assert seen.nodes["/dev/nvidia0"] == "character special file c3:0", seen  # 195:0 in hex
    assert seen.nodes["/dev/nvidiactl"] == "character special file c3:ff"
    assert {"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"} <= set(seen.nodes)
    # ld.so.cache (nodeprep's hook ran the image's ldconfig) and what dlopen really loads: the very
    # files of the active version (same device and inode as on the node)
    for lib, ident in active_files(node, version).items():
        assert seen.cache[lib] == f"{LIB_DIR}/{lib}", seen.cache
        assert seen.probe[lib] == (f"{LIB_DIR}/{lib}", ident), (lib, seen.probe)
    # the mount names the versioned root, never `current` (the node root's /opt is bound over /opt
    # in the test's namespace, so the source shows under the node root's path)
    assert len(seen.mounts) == 1
    assert seen.mounts[0].endswith(f"/opt/nvidia/{version}/lib64/libcuda.so.{version}")
    assert seen.smi == 9  # NVML found, no kernel driver; 12 would mean the library was not found


@pytest.mark.parametrize("layout", ["debian", "lib64"])
def test_podman_container_sees_devices_and_the_active_libraries(
    gpu_node: GpuNode, versions: tuple[str, str], layout: str
) -> None:
    r = gpu_node.podman_run(layout, INSPECT)
    assert r.returncode == 0, r.stderr
    assert_sees(Seen.parse(r.stdout), gpu_node, versions[0])


@pytest.mark.parametrize("device", ["0", GPU_UUID])
def test_podman_by_index_and_uuid(gpu_node: GpuNode, device: str) -> None:
    r = gpu_node.podman_run("debian", "ls /dev/nvidia0 /dev/nvidiactl", device=f"nvidia.com/gpu={device}")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["/dev/nvidia0", "/dev/nvidiactl"]
    bad = gpu_node.podman_run("debian", "true", device="nvidia.com/gpu=7")
    assert bad.returncode != 0 and "nvidia.com/gpu=7" in bad.stderr


REQUIRE_12_2 = (  # NVIDIA's CUDA 12.2.2 images (container-images/cuda dist/12.2.2, amd64), abridged
    "cuda>=12.2 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471 "
    "brand=tesla,driver>=525,driver<526 brand=unknown,driver>=525,driver<526"
)
REQUIRE_12_4 = (  # NVIDIA's CUDA 12.4.1 images, abridged
    "cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=tesla,driver>=525,driver<526 "
    "brand=tesla,driver>=535,driver<536 brand=unknown,driver>=535,driver<536"
)


def test_podman_cuda_requirement_allowed_refused_bypassed(
    gpu_node: GpuNode, versions: tuple[str, str], tmp_path: Path
) -> None:
    ok = gpu_node.podman_run("debian", "echo started", env={"NVIDIA_REQUIRE_CUDA": REQUIRE_12_2})
    assert ok.returncode == 0 and ok.stdout.strip() == "started", ok.stderr
    refused = gpu_node.podman_run("debian", "echo started", env={"NVIDIA_REQUIRE_CUDA": REQUIRE_12_4})
    assert refused.returncode != 0 and "started" not in refused.stdout  # refused before it ran
    line = (f"nodeprep: container refused: NVIDIA_REQUIRE_CUDA requires CUDA >=12.4, but driver "
            f"{versions[0]} supports up to CUDA 12.2 (set NVIDIA_DISABLE_REQUIRE=1 to skip the check)")
    assert line in refused.stderr, refused.stderr
    bypassed = gpu_node.podman_run(
        "debian", "echo started", env={"NVIDIA_REQUIRE_CUDA": REQUIRE_12_4, "NVIDIA_DISABLE_REQUIRE": "1"}
    )
    assert bypassed.returncode == 0 and bypassed.stdout.strip() == "started", bypassed.stderr
    malformed = gpu_node.podman_run("debian", "echo started", env={"NVIDIA_REQUIRE_CUDA": "cuda>>12"})
    assert malformed.returncode != 0 and "started" not in malformed.stdout
    assert "NVIDIA_REQUIRE_CUDA: malformed constraint 'cuda>>12'" in malformed.stderr
