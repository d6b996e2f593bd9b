"""Unschedulable until the GPUs are proven: the node's verdict and the cluster-side taint controller.

A node registers with `nodeprep.dev/unverified:NoSchedule` (cluster.verify_gpus). NodeRestriction
forbids a kubelet's credential to change its own taints (and RBAC forbids it to delete its Node), so
the node cannot lift it; plain RBAC cannot limit a credential to one taint on one node either. So:

- the node (`nodeprep verify-gpus --apply`, its own credential) runs the self-test
  (nodeprep.node.selftest) and publishes the verdict in a label it may set,
  `nodeprep.dev/gpu-verified`: a digest binding the verdict to the node's name, the boot the kubelet
  reported (status.nodeInfo.bootID) and the driver version label — or `failed`; the problems go to the
  annotation `nodeprep.dev/gpu-selftest`;
- a cluster-side controller (`nodeprep verify-nodes`, a credential with get/list/watch/patch on nodes
  and nothing else) lifts the taint from a node whose label equals the digest it recomputes, and puts
  it back on any GPU node without a valid verdict (a reboot or a driver change makes the old digest
  stale; a node that registered anew without the taint gets it back).

The same controller keeps `nodeprep.dev/gpu-unhealthy:NoSchedule` on a node while its condition
`GPUHealthy` is False (`nodeprep health --apply`/the nodeprep-health service write it on the Node's
status with the node's own credential) and lifts it when the condition is True again or gone.

The verdict is the node's claim: this protects against broken GPUs and stale state, not against a
node whose root is compromised (it could publish a valid digest without testing).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import requests

from ..errors import InputError, NetworkError, NodeprepError
from ..health.condition import CONDITION, HEARTBEAT
from ..kubeapi import KubeConfig, api_request, api_session, status_message
from ..labels.core import PREFIX, VERIFIED_LABEL
from ..node.selftest import Verdict
from ..profile import UNHEALTHY_TAINT, UNVERIFIED_TAINT

log = logging.getLogger(__name__)

SELFTEST_ANNOTATION = f"{PREFIX}/gpu-selftest"
DRIVER_LABEL = f"{PREFIX}/driver-version"
FAILED = "failed"
GPU_RESOURCE = "nvidia.com/gpu"
# a GPUHealthy heartbeat older than this counts as Unknown: three of the health service's heartbeats
HEALTH_STALE = 3 * HEARTBEAT


def verdict_digest(node: str, boot_id: str, driver_version: str) -> str:
    """The label value of a passed self-test: 20 hex digits over node, boot and driver version."""
    text = "\0".join(("nodeprep-gpu-verified-v1", node, boot_id, driver_version))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _meta(node: Mapping[str, Any]) -> dict[str, Any]:
    return dict(node.get("metadata") or {})


def boot_id_of(node: Mapping[str, Any]) -> str:
    return str(((node.get("status") or {}).get("nodeInfo") or {}).get("bootID") or "")


def expected_digest(node: Mapping[str, Any]) -> str | None:
    """The digest a valid verdict on this Node carries (None: the Node lacks boot id or driver label)."""
    meta = _meta(node)
    boot = boot_id_of(node)
    driver = (meta.get("labels") or {}).get(DRIVER_LABEL)
    if not boot or not driver:
        return None
    return verdict_digest(str(meta.get("name")), boot, str(driver))


# --- node side ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Published:
    node: str
    value: str
    passed: bool
    problems: tuple[str, ...]


def verdict_patch(node: Mapping[str, Any], verdict: Verdict,
                  local_boot_id: str | None) -> tuple[dict[str, Any], Published]:
    """The merge patch publishing `verdict` on `node` (pure). A verdict is only `passed` when the Node's
    reported boot is this boot and its driver label is the tested driver."""
    meta = _meta(node)
    name = str(meta.get("name"))
    problems = list(verdict.problems)
    boot = boot_id_of(node)
    driver = (meta.get("labels") or {}).get(DRIVER_LABEL)
    if not boot:
        problems.append("the Node has no status.nodeInfo.bootID yet (the kubelet has not reported)")
    elif local_boot_id and boot != local_boot_id:
        problems.append(f"the Node reports boot {boot}, this is boot {local_boot_id} (the kubelet has not "
                        "reported this boot yet)")
    if driver != verdict.driver_version:
        problems.append(f"the Node's {DRIVER_LABEL} label is {driver!r}, the tested driver is "
                        f"{verdict.driver_version!r} (run nodeprep labels --apply)")
    passed = not problems
    value = verdict_digest(name, boot, str(driver)) if passed else FAILED
    note = json.dumps({"passed": passed, "problems": problems}, separators=(",", ":"))
    patch = {"metadata": {"labels": {VERIFIED_LABEL: value}, "annotations": {SELFTEST_ANNOTATION: note}}}
    if meta.get("resourceVersion"):
        patch["metadata"]["resourceVersion"] = meta["resourceVersion"]
    return patch, Published(name, value, passed, tuple(problems))


def _url(cfg: KubeConfig, node: str) -> str:
    return f"{cfg.server}/api/v1/nodes/{quote(node, safe='')}"


def _request(s: requests.Session, method: str, url: str, server: str, body: Any = None) -> requests.Response:
    return api_request(s, method, url, server, body, timeout=15)


def publish_verdict(cfg: KubeConfig, node: str, verdict: Verdict, local_boot_id: str | None) -> Published:
    """GET the Node, PATCH the verdict label and annotation (the node's own credential suffices)."""
    with api_session(cfg) as s:
        for _ in range(3):
            r = _request(s, "GET", _url(cfg, node), cfg.server)
            if r.status_code == 404:
                raise InputError(f"node {node!r} not found at {cfg.server}")
            if r.status_code != 200:
                raise NodeprepError(f"{cfg.server}: reading node {node!r} failed (HTTP {r.status_code} "
                                    f"{status_message(r)})")
            patch, published = verdict_patch(r.json(), verdict, local_boot_id)
            r = _request(s, "PATCH", _url(cfg, node), cfg.server, patch)
            if r.status_code == 200:
                return published
            if r.status_code != 409:
                raise NodeprepError(f"{cfg.server}: publishing the verdict on node {node!r} failed "
                                    f"(HTTP {r.status_code} {status_message(r)})")
    raise NetworkError(f"{cfg.server}: node {node!r} kept changing; verdict not published")


# --- cluster side -------------------------------------------------------------------------------------

def is_gpu_node(node: Mapping[str, Any]) -> bool:
    """A node nodeprep prepared, or one that offers GPUs."""
    labels = _meta(node).get("labels") or {}
    if DRIVER_LABEL in labels or labels.get("nvidia.com/gpu.present") == "true":
        return True
    capacity = (node.get("status") or {}).get("capacity") or {}
    return str(capacity.get(GPU_RESOURCE, "0")) not in ("0", "")


def _tainted(node: Mapping[str, Any], key: str = UNVERIFIED_TAINT.key) -> bool:
    return any(t.get("key") == key for t in (node.get("spec") or {}).get("taints") or [])


def health_of(node: Mapping[str, Any]) -> tuple[str, str] | None:
    """(status, reason) of the Node's GPUHealthy condition (nodeprep health --apply), None without."""
    cond = _health_condition(node)
    return (str(cond.get("status")), str(cond.get("reason") or "")) if cond is not None else None


def _health_condition(node: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for c in (node.get("status") or {}).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == CONDITION:
            return c
    return None


def heartbeat_age(node: Mapping[str, Any], now: datetime) -> float | None:
    """Seconds since the GPUHealthy condition's lastHeartbeatTime (the health service's clock: the
    node's), None without a condition or a readable time (an unreadable one counts as very old)."""
    cond = _health_condition(node)
    if cond is None:
        return None
    try:
        beat = datetime.strptime(str(cond.get("lastHeartbeatTime")), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return float("inf")
    return max(0.0, (now - beat).total_seconds())


def _verified_change(node: Mapping[str, Any], taints: list[Any]) -> tuple[list[Any], str | None]:
    """The unverified taint's rule: lifted by a valid self-test verdict, restored without one."""
    label = (_meta(node).get("labels") or {}).get(VERIFIED_LABEL)
    want = expected_digest(node)
    valid = want is not None and label == want
    if valid and _tainted(node):
        return ([t for t in taints if t.get("key") != UNVERIFIED_TAINT.key],
                "GPU self-test passed for this boot and driver: taint removed")
    if not valid and not _tainted(node) and is_gpu_node(node):
        why = ("self-test failed" if label == FAILED else "no verdict" if label is None
               else "verdict is stale (another boot or driver)")
        return [*taints, UNVERIFIED_TAINT.to_dict()], f"no valid GPU verdict ({why}): taint added"
    return taints, None


def _health_change(node: Mapping[str, Any], taints: list[Any], now: datetime | None = None,
                   stale_after: float = HEALTH_STALE) -> tuple[list[Any], str | None]:
    """The unhealthy taint's rule: on while GPUHealthy is False, Unknown, or silent (its heartbeat older
    than `stale_after` seconds at `now`: the health service stopped writing), off while it is True and
    fresh or when the node has no condition (no health service)."""
    health = health_of(node)
    tainted = _tainted(node, UNHEALTHY_TAINT.key)
    age = heartbeat_age(node, now) if now is not None else None
    silent = age is not None and age > stale_after
    if health is not None and (health[0] != "True" or silent):
        if tainted:
            return taints, None
        if silent:
            old = "unreadable" if age == float("inf") else f"{age:.0f}s old"
            why = (f"GPUHealthy counts as Unknown: its heartbeat is {old} (bound {stale_after:g}s), the "
                   f"health reporter is silent")
        else:
            why = f"GPUHealthy={health[0]} ({health[1]})"
        return [*taints, UNHEALTHY_TAINT.to_dict()], f"{why}: {UNHEALTHY_TAINT} added"
    if tainted:
        now_is = f"GPUHealthy={health[0]}" + (" with a fresh heartbeat" if age is not None else "") \
            if health else "no GPUHealthy condition"
        return ([t for t in taints if t.get("key") != UNHEALTHY_TAINT.key],
                f"{now_is}: {UNHEALTHY_TAINT} removed")
    return taints, None


def reconcile(node: Mapping[str, Any], now: datetime | None = None,
              stale_after: float = HEALTH_STALE) -> tuple[dict[str, Any] | None, str]:
    """(merge patch or None, one-line reason) for one Node (pure): the unverified taint by the
    self-test verdict, the unhealthy taint by the GPUHealthy condition (and, given `now`, its
    heartbeat's age)."""
    meta = _meta(node)
    kept = list((node.get("spec") or {}).get("taints") or [])
    reasons = []
    kept, why = _verified_change(node, kept)
    reasons += [why] if why else []
    kept, why = _health_change(node, kept, now, stale_after)
    reasons += [why] if why else []
    if not reasons:
        return None, "unchanged"
    reason = "; ".join(reasons)
    patch: dict[str, Any] = {"spec": {"taints": kept}}
    if meta.get("resourceVersion"):
        patch["metadata"] = {"resourceVersion": meta["resourceVersion"]}
    return patch, reason


def verify_nodes(cfg: KubeConfig, *, check: bool = False, stale_after: float = HEALTH_STALE) -> list[str]:
    """One pass over all Nodes: lift or restore the unverified taint; one line per change. `check`:
    one line per change it would make, nothing patched."""
    out = []
    with api_session(cfg) as s:
        r = _request(s, "GET", f"{cfg.server}/api/v1/nodes", cfg.server)
        if r.status_code != 200:
            raise NodeprepError(f"{cfg.server}: listing nodes failed (HTTP {r.status_code} "
                                f"{status_message(r)})")
        for node in r.json().get("items") or []:
            patch, reason = reconcile(node, datetime.now(UTC), stale_after)
            if patch is None:
                continue
            name = str(_meta(node).get("name"))
            if check:
                out.append(f"node {name}: {reason} (--check: not patched)")
                continue
            r = _request(s, "PATCH", _url(cfg, name), cfg.server, patch)
            if r.status_code == 200:
                out.append(f"node {name}: {reason}")
            elif r.status_code == 409:
                out.append(f"node {name}: changed meanwhile; next pass")
            else:
                raise NodeprepError(f"{cfg.server}: patching node {name!r} failed (HTTP {r.status_code} "
                                    f"{status_message(r)})")
    return out
