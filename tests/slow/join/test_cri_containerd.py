"""Containers started by containerd 1.7 (Debian 13) and 2.1 (Debian sid) through the CRI, as kubelet
starts them: a pod sandbox, then a container whose CRI request carries the CDI device
nvidia.com/gpu=all, resolved by containerd's CRI plugin with nodeprep's drop-in (enable_cdi) against
the spec nodeprep wrote. How containerd, the images and the CRI client are set up: criclient.py;
the GPU node and its stand-ins: gpunode.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .criclient import CONTAINERD_IDS, CONTAINERDS, Containerd, running_containerd
from .gpunode import INSPECT, GpuNode, Seen
from .test_cdi_podman import REQUIRE_12_2, REQUIRE_12_4, active_files, assert_sees
from .test_cdi_toolkit import LINKS, nvidia_cdi_hook

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=CONTAINERDS, ids=CONTAINERD_IDS)
def containerd(  # type: ignore[no-untyped-def]
    request, gpu_node: GpuNode, cri_images: Path, test_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Containerd, str]]:
    os_name, major_minor = request.param
    pytest.importorskip("grpc_tools", reason="grpcio-tools (pyproject [test] extras)")
    work = tmp_path_factory.mktemp(f"containerd-{major_minor}")
    with running_containerd(gpu_node, test_cache, os_name, work, cri_images,
                            tmp_path_factory.mktemp("cri-gen")) as daemon:
        yield daemon, major_minor


def test_cri_container_sees_devices_and_the_active_libraries(
    containerd: tuple[Containerd, str], gpu_node: GpuNode, versions: tuple[str, str]
) -> None:
    daemon, major_minor = containerd
    assert daemon.version().runtime_version.lstrip("v").startswith(f"{major_minor}.")
    sid, sconfig = daemon.run_pod("inspect")
    for layout in ("debian", "lib64"):
        code, out = daemon.run_container(sid, sconfig, f"inspect-{layout}", layout, INSPECT)
        assert code == 0, out
        print(f"containerd {major_minor} CRI, {layout} image:\n{out}")  # shown with -s (docs/join.md)
        assert_sees(Seen.parse(out), gpu_node, versions[0], layout)


def test_cri_cuda_requirement_allowed_refused_bypassed(
    containerd: tuple[Containerd, str], versions: tuple[str, str]
) -> None:
    import grpc

    daemon, _ = containerd
    sid, sconfig = daemon.run_pod("require")
    code, out = daemon.run_container(sid, sconfig, "allowed", "debian", "echo started",
                                     env={"NVIDIA_REQUIRE_CUDA": REQUIRE_12_2})
    assert (code, out.strip()) == (0, "started")
    with pytest.raises(grpc.RpcError) as refused:
        daemon.run_container(sid, sconfig, "refused", "debian", "echo started",
                             env={"NVIDIA_REQUIRE_CUDA": REQUIRE_12_4})
    line = (f"nodeprep: container refused: NVIDIA_REQUIRE_CUDA requires CUDA >=12.4, but driver "
            f"{versions[0]} supports up to CUDA 12.2")
    assert line in refused.value.details(), refused.value.details()
    print(f"StartContainer refused: {refused.value.details()}")  # shown with -s (docs/join.md)
    code, out = daemon.run_container(sid, sconfig, "bypassed", "debian", "echo started",
                                     env={"NVIDIA_REQUIRE_CUDA": REQUIRE_12_4, "NVIDIA_DISABLE_REQUIRE": "1"})
    assert (code, out.strip()) == (0, "started")


def test_cri_runs_nvidia_cdi_hook(
    containerd: tuple[Containerd, str], gpu_node: GpuNode, versions: tuple[str, str], test_cache: Path
) -> None:
    """With NVIDIA's real nvidia-cdi-hook on the node, containerd's CRI runs nodeprep's hook from the
    spec (which would run NVIDIA's for an image with CUDA compat libraries), whose libcuda.so link
    loads the active libcuda (test_cdi_toolkit.py for podman, compat included)."""
    daemon, major_minor = containerd
    with gpu_node.nvidia_cdi_hook(nvidia_cdi_hook(test_cache)) as spec:
        ours = spec["containerEdits"]["hooks"][-1]
        assert ours["args"][5:7] == ["--nvidia-cdi-hook", "/usr/bin/nvidia-cdi-hook"]
        sid, sconfig = daemon.run_pod("nvidia-hook")
        code, out = daemon.run_container(sid, sconfig, "nvidia-hook", "debian",
                                         LINKS + "probe libcuda.so | sed 's/^/probe /'")
    assert code == 0, out
    print(f"containerd {major_minor} CRI, NVIDIA's nvidia-cdi-hook:\n{out}")  # shown with -s (docs/join.md)
    made = [line.split()[1] for line in out.splitlines() if line.startswith("libcuda.so ")]
    assert made == [f"/opt/nvidia/{versions[0]}/lib64/libcuda.so.1"]  # by nodeprep's hook, Debian layout
    ident = active_files(gpu_node, versions[0])["libcuda.so.1"]
    assert Seen.parse(out).probe["libcuda.so"][1] == ident
