"""What the cluster sees of `nodeprep health`: the Node condition `GPUHealthy` on the Node's status.

The node writes it with its own credential (the kubelet's kubeconfig): the Node authorizer lets
`system:node:NAME` patch `nodes/NAME/status`, and NodeRestriction does not stop it (it stops a node
changing its taints, so the taint `nodeprep.dev/gpu-unhealthy:NoSchedule` is added and lifted by
`nodeprep verify-nodes`, the cluster-side controller, from this condition: nodeprep.join.verification).
The patch is a strategic merge patch of `status.conditions`, merged by `type`, so the kubelet's own
conditions are left alone. `lastTransitionTime` moves only when the status changes;
`lastHeartbeatTime` on every write.

`Publisher` writes at most once per `min_interval` seconds (a changed verdict waits for it), again
every `heartbeat` seconds, and when the API server does not answer it keeps the newest condition and
retries with a backoff (1 s doubling to 30 s), so the service outlives an API server restart.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from ..errors import NodeprepError
from ..kubeapi import Connection, KubeConfig, connection
from .verdict import NodeVerdict

log = logging.getLogger(__name__)

CONDITION = "GPUHealthy"
STRATEGIC = "application/strategic-merge-patch+json"
HEARTBEAT = 60.0  # seconds: the condition is written again this often while nothing changes


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(verdict: NodeVerdict, previous: dict[str, Any] | None, stamp: str) -> dict[str, Any]:
    """The condition for `verdict` (pure); `previous`: the Node's GPUHealthy condition now, if any."""
    same = previous is not None and previous.get("status") == verdict.status
    return {"type": CONDITION, "status": verdict.status, "reason": verdict.reason,
            "message": verdict.message, "lastHeartbeatTime": stamp,
            "lastTransitionTime": str(previous.get("lastTransitionTime") or stamp) if same and previous
            else stamp}


def status_patch(cond: dict[str, Any]) -> dict[str, Any]:
    return {"status": {"conditions": [cond]}}


def current_condition(node: dict[str, Any]) -> dict[str, Any] | None:
    for c in (node.get("status") or {}).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == CONDITION:
            return c
    return None


def _path(node: str, sub: str = "") -> str:
    return f"/api/v1/nodes/{quote(node, safe='')}{sub}"


def write_condition(cfg: KubeConfig, node: str, verdict: NodeVerdict, *,
                    conn: Connection | None = None) -> dict[str, Any]:
    """GET the Node, PATCH its GPUHealthy condition; the condition written. NetworkError when the API
    server does not answer, NodeprepError when it refuses."""
    def run(c: Connection) -> dict[str, Any]:
        status, body, message = c.request("GET", _path(node))
        if status != 200 or not isinstance(body, dict):
            raise NodeprepError(f"{cfg.server}: reading node {node!r} failed (HTTP {status} {message})")
        cond = condition(verdict, current_condition(body), _now())
        status, _, message = c.request("PATCH", _path(node, "/status"), status_patch(cond), STRATEGIC)
        if status != 200:
            raise NodeprepError(f"{cfg.server}: patching the status of node {node!r} failed "
                                f"(HTTP {status} {message})")
        return cond

    if conn is not None:
        return run(conn)
    with connection(cfg) as c:
        return run(c)


@dataclass
class Publisher:
    """The rate-limited, retrying writer of one Node's condition (the service's; not thread-safe)."""

    cfg: KubeConfig
    node: str
    min_interval: float = 1.0
    heartbeat: float = HEARTBEAT
    clock: Any = time.monotonic
    written: tuple[str, str, str] | None = None  # (status, reason, message) the API server holds
    last_write: float = -1e18
    next_try: float = 0.0
    backoff: float = 0.0
    failures: int = 0
    log_lines: list[str] = field(default_factory=list)

    def due(self, verdict: NodeVerdict) -> bool:
        now = self.clock()
        if now < self.next_try or now - self.last_write < self.min_interval:
            return False
        key = (verdict.status, verdict.reason, verdict.message)
        return key != self.written or now - self.last_write >= self.heartbeat

    def offer(self, verdict: NodeVerdict, conn: Connection) -> str | None:
        """Write `verdict` when it is due; a line saying what happened when something did."""
        if not self.due(verdict):
            return None
        now = self.clock()
        try:
            cond = write_condition(self.cfg, self.node, verdict, conn=conn)
        except NodeprepError as e:
            self.failures += 1
            self.backoff = min(30.0, max(1.0, self.backoff * 2))
            self.next_try = now + self.backoff
            return f"node {self.node}: condition not written ({e}); retrying in {self.backoff:.0f}s"
        changed = self.written is None or self.written[:2] != (verdict.status, verdict.reason)
        recovered = self.failures > 0
        self.written = (verdict.status, verdict.reason, verdict.message)
        self.last_write, self.backoff, self.next_try, self.failures = now, 0.0, 0.0, 0
        if changed or recovered:
            return (f"node {self.node}: {CONDITION}={cond['status']} reason {cond['reason']}: "
                    f"{cond['message']}")
        return None
