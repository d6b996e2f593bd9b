"""The CUDA gate through containerd's CRI path (1.7 and 2.1, as kubelet drives them): nodeprep writes
the runtime handlers' base spec from containerd's default spec for the node's containerd version
(nodeprep's data, the version from the root's dpkg status) with the gate as a createContainer hook
(criclient.py, `gate=True`), and a container gets its GPU from a DRA-format claim spec written
here (test_cuda_gate_podman.dra_spec), not from nodeprep's spec. The node's driver is the active
535.309.01 build (CUDA 12.2); no GPU facts file: brand unknown."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeprep.runtime import containerd as ctd

from .criclient import CONTAINERD_IDS, CONTAINERDS, Containerd, running_containerd
from .gpunode import GpuNode
from .test_cuda_gate_podman import CLAIM_UID, DRA_KIND, dra_spec

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=CONTAINERDS, ids=CONTAINERD_IDS)
def gated(  # type: ignore[no-untyped-def]
    request, gpu_node: GpuNode, versions: tuple[str, str], cri_images: Path, test_cache: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Containerd]:
    os_name, major_minor = request.param
    pytest.importorskip("grpc_tools", reason="grpcio-tools (pyproject [test] extras)")
    work = tmp_path_factory.mktemp(f"containerd-gate-{major_minor}")
    with running_containerd(gpu_node, test_cache, os_name, work, cri_images,
                            tmp_path_factory.mktemp("cri-gen"), gate=True) as daemon:
        yield daemon


@pytest.fixture
def claim(gpu_node: GpuNode, versions: tuple[str, str]) -> Iterator[Path]:
    """The claim's spec in the shared node's CDI directory for one test only (pytest may run other
    modules' containerd tests while this module's daemon is up: they must not see a second spec)."""
    spec = gpu_node.root / "etc/cdi" / f"k8s.gpu.nvidia.com-claim_{CLAIM_UID}.json"
    spec.write_text(json.dumps(dra_spec(versions[0])))
    try:
        yield spec
    finally:
        spec.unlink(missing_ok=True)


def test_cri_gate_from_the_handlers_base_spec(
    gated: Containerd, versions: tuple[str, str], claim: Path
) -> None:
    import grpc

    root = gated.work / "root"
    base = json.loads((root / "etc/containerd" / ctd.BASE_SPEC_NAME).read_text())
    assert [h["args"][-4:] for h in base["hooks"]["createContainer"]][-1][0] == "--driver-root"
    assert "cgroupsPath" not in base["linux"]
    drop_in = (root / "etc/containerd/conf.d" / ctd.DROP_IN_NAME).read_text()
    assert f'base_runtime_spec = "/etc/containerd/{ctd.BASE_SPEC_NAME}"' in drop_in
    device = f"{DRA_KIND}={CLAIM_UID}"
    sid, sconfig = gated.run_pod("gate")  # the pod sandbox passes the gate too (no GPU)
    code, out = gated.run_container(sid, sconfig, "allowed", "debian", "ls /dev/nvidia0; echo started",
                                    env={"NVIDIA_REQUIRE_CUDA": "cuda>=12.2"}, device=device)
    assert (code, out.split()) == (0, ["/dev/nvidia0", "started"])
    with pytest.raises(grpc.RpcError) as refused:
        gated.run_container(sid, sconfig, "refused", "debian", "echo started",
                            env={"NVIDIA_REQUIRE_CUDA": "cuda>=99.0"}, device=device)
    line = (f"nodeprep: container refused: NVIDIA_REQUIRE_CUDA requires CUDA >=99.0, but driver "
            f"{versions[0]} supports up to CUDA 12.2")
    assert line in refused.value.details(), refused.value.details()
    print(f"StartContainer refused: {refused.value.details()}")  # shown with -s (docs/join.md)
    code, out = gated.run_container(sid, sconfig, "bypassed", "debian", "echo started", device=device,
                                    env={"NVIDIA_REQUIRE_CUDA": "cuda>=99.0", "NVIDIA_DISABLE_REQUIRE": "1"})
    assert (code, out.strip()) == (0, "started")
