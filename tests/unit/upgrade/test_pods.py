"""Which pods leave a node (nodeprep.upgrade.pods.decide): pure over pod JSON shaped as the API
server returns it; nothing GPU-like runs."""

from __future__ import annotations

from typing import Any

from nodeprep.upgrade.pods import OPT_OUT_LABEL, decide, gpu_resources, nvidia_claims


def pod(
    name: str,
    *,
    limits: dict[str, str] | None = None,
    requests: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    init: bool = False,
    owner: str | None = None,
    phase: str = "Running",
    claims: list[dict[str, str]] | None = None,
    claim_status: list[dict[str, str]] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    c = {
        "name": "c",
        "image": "x",
        "resources": {k: v for k, v in (("limits", limits), ("requests", requests)) if v},
    }
    spec: dict[str, Any] = {"initContainers" if init else "containers": [c]}
    if init:
        spec["containers"] = [{"name": "main", "image": "x"}]
    if claims:
        spec["resourceClaims"] = claims
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ml",
        "labels": labels or {},
        "annotations": annotations or {},
    }
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": "o", "controller": True}]
    status: dict[str, Any] = {"phase": phase}
    if claim_status:
        status["resourceClaimStatuses"] = claim_status
    return {"metadata": meta, "spec": spec, "status": status}


def test_gpu_resources_in_requests_limits_and_init_containers() -> None:
    assert gpu_resources(pod("a", limits={"nvidia.com/gpu": "1", "cpu": "1"})) == ["nvidia.com/gpu"]
    assert gpu_resources(pod("b", requests={"nvidia.com/mig-1g.10gb": "1"})) == ["nvidia.com/mig-1g.10gb"]
    assert gpu_resources(pod("c", limits={"nvidia.com/gpu.shared": "1"}, init=True)) == [
        "nvidia.com/gpu.shared"
    ]
    assert gpu_resources(pod("d", limits={"amd.com/gpu": "1", "nvidia.com/other": "1"})) == []


def test_only_gpu_pods_go() -> None:
    assert decide(pod("train", limits={"nvidia.com/gpu": "8"})).evict
    web = decide(pod("web", limits={"cpu": "2"}))
    assert not web.evict and web.why == "uses no GPU"
    assert decide(pod("web", limits={"cpu": "2"}), full_drain=True).evict


def test_never_evicted_daemonsets_mirror_finished_opted_out() -> None:
    gpu = {"nvidia.com/gpu": "1"}
    assert decide(pod("dp", limits=gpu, owner="DaemonSet"), full_drain=True).why == "DaemonSet pod"
    assert not decide(pod("s", limits=gpu, annotations={"kubernetes.io/config.mirror": "x"})).evict
    assert decide(pod("j", limits=gpu, phase="Succeeded")).why == "finished"
    out = decide(pod("keep", limits=gpu, labels={OPT_OUT_LABEL: "true"}))
    assert not out.evict and OPT_OUT_LABEL in out.why
    assert (
        decide(pod("keep", limits=gpu, labels={"mine/skip": "true"}), opt_out_label="mine/skip").evict
        is False
    )
    assert decide(pod("rs", limits=gpu, owner="ReplicaSet")).evict


def claim(name: str, device_class: str, *, v1: bool = False) -> dict[str, Any]:
    req = (
        {"name": "gpu", "exactly": {"deviceClassName": device_class}}
        if v1
        else {"name": "gpu", "deviceClassName": device_class}
    )
    return {"metadata": {"name": name}, "spec": {"devices": {"requests": [req]}}}


def test_dra_claims_of_an_nvidia_device_class() -> None:
    p = pod(
        "dra", claims=[{"name": "gpu"}], claim_status=[{"name": "gpu", "resourceClaimName": "dra-gpu-x1"}]
    )
    claims = {"dra-gpu-x1": claim("dra-gpu-x1", "gpu.nvidia.com")}
    assert nvidia_claims(p, claims) == ["dra-gpu-x1"]
    assert decide(p, claims=claims).evict
    assert decide(p, claims={"dra-gpu-x1": claim("dra-gpu-x1", "mig.nvidia.com", v1=True)}).evict
    other = {"dra-gpu-x1": claim("dra-gpu-x1", "nic.example.com")}
    assert not decide(p, claims=other).evict
    named = pod("dra2", claims=[{"name": "gpu", "resourceClaimName": "shared"}])
    assert (
        decide(named, claims={"shared": claim("shared", "gpu.nvidia.com")}).why
        == "holds NVIDIA DRA claim shared"
    )


def test_an_unreadable_claim_counts_as_a_gpu_claim() -> None:
    p = pod("dra", claims=[{"name": "gpu", "resourceClaimTemplateName": "t"}])
    d = decide(p, claims={})
    assert d.evict and "not allocated" in d.why
