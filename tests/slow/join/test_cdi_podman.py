"""Containers started by podman 4.3 (Debian 12) through the CDI spec nodeprep wrote for a node root
with the real 535 user space installed and activated (fixtures: conftest.py; what is real and what
stands in for the GPU: gpunode.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .gpunode import GPU_UUID, INSPECT, GpuNode, Seen, file_id, make_rootfs_tar, run, unpack_rootfs

pytestmark = pytest.mark.slow

LIB_DIR = "/usr/lib/x86_64-linux-gnu"
# where each image's loader finds the mounted libraries without an ld cache entry: the first of its
# default directories (Debian: /lib/x86_64-linux-gnu then /usr/lib/x86_64-linux-gnu; RHEL/UBI: /lib64
# then /usr/lib64), which in merged-/usr images is a link to the directory the spec mounts into
FOUND_IN = {"debian": "/lib/x86_64-linux-gnu", "lib64": "/lib64"}


def active_files(node: GpuNode, version: str) -> dict[str, str]:
    lib = node.root / "opt/nvidia" / version / "lib64"
    return {name: file_id(lib / f"{name.rsplit('.so', 1)[0]}.so.{version}")
            for name in ("libcuda.so.1", "libnvidia-ml.so.1")}


def assert_sees(seen: Seen, node: GpuNode, version: str, layout: str) -> None:
    assert seen.nodes["/dev/nvidia0"] == "character special file c3:0", seen  # 195:0 in hex
    assert seen.nodes["/dev/nvidiactl"] == "character special file c3:ff"
    assert {"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"} <= set(seen.nodes)
    # what dlopen really loads: the very files of the active version (same device and inode as on
    # the node), found in the loader's default directory of the layout: the image's ld.so.cache has
    # no entry for them (no ldconfig ran at container start)
    for lib, ident in active_files(node, version).items():
        assert lib not in seen.cache, seen.cache
        assert seen.probe[lib] == (f"{FOUND_IN[layout]}/{lib}", ident), (lib, seen.probe)
    # one mount, the versioned library folder, never `current` (the node root's /opt is bound over
    # /opt in the test's namespace, so the source shows under the node root's path); the loader
    # reaches it through the links nodeprep's hook made in the layout's default directory only
    assert len(seen.mounts) == 1 and seen.mounts[0].endswith(f"/opt/nvidia/{version}/lib64"), seen.mounts
    where = "/usr/lib64" if layout == "lib64" else LIB_DIR
    assert seen.links == {f"{where}/libcuda.so.1": f"/opt/nvidia/{version}/lib64/libcuda.so.1"}, seen.links
    assert seen.smi == 9  # NVML found, no kernel driver; 12 would mean the library was not found


@pytest.mark.parametrize("layout", ["debian", "lib64"])
def test_podman_container_sees_devices_and_the_active_libraries(
    gpu_node: GpuNode, versions: tuple[str, str], layout: str
) -> None:
    r = gpu_node.podman_run(layout, INSPECT)
    assert r.returncode == 0, r.stderr
    print(f"podman, {layout} image:\n{r.stdout}")  # shown with -s (docs/join.md)
    assert_sees(Seen.parse(r.stdout), gpu_node, versions[0], layout)
    # the image's own loader: the lib64 image's does not search the multiarch directory at all
    search = gpu_node.podman_run(layout, "/lib64/ld-linux-x86-64.so.2 --help | grep 'system search path'")
    dirs = [line.split()[0] for line in search.stdout.splitlines()]
    assert ("/usr/lib/x86_64-linux-gnu" in dirs) == (layout == "debian"), dirs
    assert ("/usr/lib64" in dirs) == (layout == "lib64"), dirs


def test_podman_image_whose_ld_cache_names_another_libcuda(
    gpu_node: GpuNode, versions: tuple[str, str], cdi_cache: Path
) -> None:
    """An image with its own libcuda.so.1 in its ld.so.cache (as CUDA's forward-compatibility
    libraries registered through an ld.so.conf.d entry would be; here the real 535.216.03 file):
    the cache comes before the loader's default directories, so nodeprep's hook rebuilds it with
    the mounted directory first and the container loads the active version's file."""
    first, second = versions
    work = gpu_node.work
    rootfs = unpack_rootfs(make_rootfs_tar(cdi_cache), work / "rootfs-compat", work / "probe",
                           layout="debian")
    compat = rootfs / "usr/local/cuda/compat"
    compat.mkdir(parents=True)
    shutil.copy(gpu_node.root / f"opt/nvidia/{second}/lib64/libcuda.so.{second}", compat)
    (rootfs / "etc/ld.so.conf.d/000_cuda_compat.conf").write_text("/usr/local/cuda/compat\n")
    run(["chroot", rootfs, "ldconfig"])
    # without nodeprep's hook the image's loader takes its own file (the cache wins)
    assert run(["chroot", rootfs, "probe", "libcuda.so.1"]).stdout.split()[1] == \
        "/usr/local/cuda/compat/libcuda.so.1"
    gpu_node.rootfs["compat"] = rootfs
    r = gpu_node.podman_run("compat", INSPECT)
    assert r.returncode == 0, r.stderr
    print(f"podman, image with its own libcuda.so.1 in its ld cache:\n{r.stdout}")  # docs/join.md
    seen = Seen.parse(r.stdout)
    ident = active_files(gpu_node, first)["libcuda.so.1"]
    assert seen.probe["libcuda.so.1"] == (f"{LIB_DIR}/libcuda.so.1", ident)
    in_cache = [line.split()[2] for line in r.stdout.splitlines() if line.startswith("cache libcuda.so.1 ")]
    assert in_cache == [f"{LIB_DIR}/libcuda.so.1", "/usr/local/cuda/compat/libcuda.so.1"]  # ours first
    assert (rootfs / "etc/ld.so.conf.d/00-nodeprep-nvidia.conf").read_text() == f"{LIB_DIR}\n"


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
