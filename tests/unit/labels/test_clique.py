"""`nvidia.com/gpu.clique` by GFD v0.20.0's rules (internal/lm/imex.go with go-nvlib's IsFabricAttached),
on GPU facts written out here (nothing GPU-like runs: the rule is pure). The same rules against GFD
itself, on NVIDIA's NVML mock, are tests/slow/labels/test_labels_gfd_mocknvml.py.
"""

from __future__ import annotations

from nodeprep.labels.core import clique_labels
from nodeprep.labels.gpu import Fabric, Gpu, uuid_text

CLUSTER = "7f3c9a10-52e1-4b7e-9d2a-0c61e3b8a4f5"
KEY = "nvidia.com/gpu.clique"


def gpus(*fabrics: Fabric | None, error: int | None = None) -> tuple[Gpu, ...]:
    return tuple(Gpu(name="NVIDIA GB200", fabric=f,
                     fabric_error="nvmlDeviceGetGpuFabricInfo: Unknown Error" if i == error else None)
                 for i, f in enumerate(fabrics))


def fabric(state: int = 3, status: int = 0, clique: int = 32766, cluster: str = CLUSTER) -> Fabric:
    return Fabric(state=state, status=status, clique_id=clique, cluster_uuid=cluster)


def test_uuid_text_is_gos_uuid_string() -> None:
    assert uuid_text(bytes.fromhex("7f3c9a1052e14b7e9d2a0c61e3b8a4f5")) == CLUSTER


def test_all_gpus_completed_in_one_clique_give_cluster_dot_clique() -> None:
    warnings: list[str] = []
    assert clique_labels(gpus(*[fabric()] * 4), warnings) == {KEY: f"{CLUSTER}.32766"}
    assert warnings == []


def test_no_fabric_no_label() -> None:
    warnings: list[str] = []
    assert clique_labels(gpus(None, None), warnings) == {}
    assert warnings == []


def test_gpus_not_completed_are_left_out_and_named() -> None:
    warnings: list[str] = []
    labels = clique_labels(gpus(fabric(), fabric(state=2), fabric(state=1)), warnings)
    assert labels == {KEY: f"{CLUSTER}.32766"}
    assert warnings == ["gpu: NVLink fabric not complete on GPU 1, 2 (In Progress, Not Started): "
                        "left out of nvidia.com/gpu.clique"]


def test_fabric_in_progress_everywhere_gives_no_label() -> None:
    warnings: list[str] = []
    assert clique_labels(gpus(fabric(state=2), fabric(state=2)), warnings) == {}
    assert "GPU 0, 1 (In Progress)" in warnings[0]


def test_failed_status_or_zero_cluster_is_not_attached() -> None:
    zero = "00000000-0000-0000-0000-000000000000"
    assert clique_labels(gpus(fabric(status=999), fabric(cluster=zero)), []) == {}
    assert clique_labels(gpus(fabric(status=999), fabric(clique=5)), []) == {KEY: f"{CLUSTER}.5"}


def test_disagreeing_gpus_give_no_label() -> None:
    warnings: list[str] = []
    assert clique_labels(gpus(fabric(), fabric(clique=1)), warnings) == {}
    assert "clique ids 1, 32766" in warnings[0]
    other = "7f3c9a10-52e1-4b7e-9d2a-0c61e3b8a4f6"
    assert clique_labels(gpus(fabric(), fabric(cluster=other)), warnings) == {}
    assert other in warnings[1]


def test_an_nvml_failure_gives_no_label_and_says_so() -> None:
    warnings: list[str] = []
    assert clique_labels(gpus(fabric(), None, error=1), warnings) == {}
    assert warnings == ["gpu: GPU 1: nvmlDeviceGetGpuFabricInfo: Unknown Error; "
                        "nvidia.com/gpu.clique not set"]
