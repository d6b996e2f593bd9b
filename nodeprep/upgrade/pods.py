"""Which pods leave a node before its driver changes (pure, over pod JSON).

A GPU pod requests or limits a `nvidia.com/gpu*` or `nvidia.com/mig-*` resource in any container
(init and ephemeral ones too), or holds a DRA resource claim whose device class is NVIDIA's (a class
name ending in `nvidia.com`, as NVIDIA's DRA driver names them: gpu.nvidia.com, mig.nvidia.com). A
claim that cannot be read (no DRA API, or not found) counts as a GPU claim: the driver under it would
change. Never evicted: pods of a DaemonSet, mirror (static) pods, finished pods, and pods carrying the
opt-out label with the value "true". A full drain takes every other pod too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

OPT_OUT_LABEL = "nodeprep.dev/upgrade-skip-eviction"
GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")
NVIDIA_CLASS_SUFFIX = "nvidia.com"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


@dataclass(frozen=True)
class Decision:
    namespace: str
    name: str
    evict: bool
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"pod": f"{self.namespace}/{self.name}", "evict": self.evict, "why": self.why}


def _containers(pod: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    spec = pod.get("spec") or {}
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(key) or []:
            if isinstance(c, Mapping):
                yield c


def gpu_resources(pod: Mapping[str, Any]) -> list[str]:
    """The NVIDIA resources the pod's containers request or limit, sorted."""
    found = set()
    for c in _containers(pod):
        res = c.get("resources") or {}
        for kind in ("requests", "limits"):
            for name in res.get(kind) or {}:
                if isinstance(name, str) and name.startswith(GPU_RESOURCE_PREFIXES):
                    found.add(name)
    return sorted(found)


def _device_classes(claim: Mapping[str, Any]) -> list[str]:
    """The device class names a ResourceClaim asks for (resource.k8s.io v1beta1 and v1 shapes)."""
    out = []
    for req in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        if not isinstance(req, Mapping):
            continue
        for where in (req, req.get("exactly") or {}):
            name = where.get("deviceClassName") if isinstance(where, Mapping) else None
            if isinstance(name, str):
                out.append(name)
        for sub in req.get("firstAvailable") or []:
            if isinstance(sub, Mapping) and isinstance(sub.get("deviceClassName"), str):
                out.append(sub["deviceClassName"])
    return out


def claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The ResourceClaim object names the pod holds (status.resourceClaimStatuses, else spec's
    resourceClaimName)."""
    names = []
    statuses = {
        s.get("name"): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        if isinstance(s, Mapping)
    }
    for rc in (pod.get("spec") or {}).get("resourceClaims") or []:
        if not isinstance(rc, Mapping):
            continue
        name = rc.get("resourceClaimName") or statuses.get(rc.get("name"))
        names.append(str(name) if name else f"<{rc.get('name')}: not allocated>")
    return names


def nvidia_claims(pod: Mapping[str, Any], claims: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The pod's claims of an NVIDIA device class; `claims` maps claim name -> ResourceClaim (of the
    pod's namespace). An unreadable claim counts."""
    out = []
    for name in claim_names(pod):
        claim = claims.get(name)
        if claim is None or any(c.endswith(NVIDIA_CLASS_SUFFIX) for c in _device_classes(claim)):
            out.append(name)
    return out


def _owned_by_daemonset(pod: Mapping[str, Any]) -> bool:
    return any(
        isinstance(o, Mapping) and o.get("kind") == "DaemonSet" and o.get("controller")
        for o in (pod.get("metadata") or {}).get("ownerReferences") or []
    )


def decide(
    pod: Mapping[str, Any],
    *,
    claims: Mapping[str, Mapping[str, Any]] | None = None,
    full_drain: bool = False,
    opt_out_label: str = OPT_OUT_LABEL,
) -> Decision:
    """Whether `pod` is evicted before the node's driver changes, and why."""
    meta = pod.get("metadata") or {}
    ns, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    labels = meta.get("labels") or {}

    def keep(why: str) -> Decision:
        return Decision(ns, name, False, why)

    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return keep("finished")
    if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
        return keep("mirror pod (static, the kubelet's own)")
    if _owned_by_daemonset(pod):
        return keep("DaemonSet pod")
    if str(labels.get(opt_out_label, "")).lower() == "true":
        return keep(f"opted out ({opt_out_label}=true)")
    resources = gpu_resources(pod)
    if resources:
        return Decision(ns, name, True, "uses " + ", ".join(resources))
    held = nvidia_claims(pod, claims or {}) if (pod.get("spec") or {}).get("resourceClaims") else []
    if held:
        return Decision(ns, name, True, "holds NVIDIA DRA claim " + ", ".join(held))
    if full_drain:
        return Decision(ns, name, True, "full drain")
    return keep("uses no GPU")


def to_evict(pods: Sequence[Mapping[str, Any]], **kwargs: Any) -> list[Decision]:
    """decide() for every pod, in the order given."""
    return [decide(p, **kwargs) for p in pods]
