"""The Kubernetes side of a node's upgrade (the edge): read and patch the Node, list its pods, evict
them through the Eviction API (policy/v1) with PodDisruptionBudgets honoured, wait for them to go.

An eviction the API server answers 429 is blocked by a disruption budget: retried every `interval`
seconds until `timeout`, then one error naming the budget (from the refusal's causes, else the
namespace's budgets whose selector matches the pod).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import requests

from ..errors import InputError, NodeprepError
from ..kubeapi import PATCH_TYPE, KubeConfig, api_request, api_session, object_answer, status_message

Clock = Callable[[], float]
Sleep = Callable[[float], None]


class EvictionBlocked(NodeprepError):
    """A PodDisruptionBudget kept refusing an eviction until the timeout."""


@dataclass
class Cluster:
    """One API session for one rollout step."""

    cfg: KubeConfig
    session: requests.Session
    clock: Clock = time.monotonic
    sleep: Sleep = time.sleep

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> requests.Response:
        url = self.cfg.server + path + (("?" + urlencode(params)) if params else "")
        return api_request(self.session, method, url, self.cfg.server, body, timeout=30,
                           content_type=content_type)

    def _json(self, r: requests.Response, what: str) -> dict[str, Any]:
        return object_answer(r, self.cfg.server, what)

    def node(self, name: str) -> dict[str, Any]:
        r = self.request("GET", f"/api/v1/nodes/{quote(name, safe='')}")
        if r.status_code == 404:
            raise InputError(f"node {name!r} not found at {self.cfg.server}")
        return self._json(r, f"reading node {name!r}")

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        r = self.request("PATCH", f"/api/v1/nodes/{quote(name, safe='')}", patch, content_type=PATCH_TYPE)
        return self._json(r, f"patching node {name!r}")

    def pods_on(self, node: str, *, selector: str | None = None) -> list[dict[str, Any]]:
        params = {"fieldSelector": f"spec.nodeName={node}"}
        if selector:
            params["labelSelector"] = selector
        items = self._json(self.request("GET", "/api/v1/pods", params=params), f"listing pods on {node!r}")
        return [p for p in items.get("items") or [] if isinstance(p, dict)]

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        r = self.request("GET", f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}")
        return None if r.status_code == 404 else self._json(r, f"reading pod {namespace}/{name}")

    def resource_claims(self, namespace: str) -> dict[str, dict[str, Any]]:
        """The namespace's ResourceClaims by name ({} where the API server has no DRA API)."""
        for version in ("v1", "v1beta2", "v1beta1"):
            r = self.request(
                "GET",
                f"/apis/resource.k8s.io/{version}/namespaces/{quote(namespace, safe='')}/resourceclaims",
            )
            if r.status_code == 200:
                return {
                    str((c.get("metadata") or {}).get("name")): c
                    for c in self._json(r, "listing resource claims").get("items") or []
                }
        return {}

    def budgets(self, namespace: str) -> list[dict[str, Any]]:
        r = self.request(
            "GET", f"/apis/policy/v1/namespaces/{quote(namespace, safe='')}/poddisruptionbudgets"
        )
        return (
            list(self._json(r, "listing PodDisruptionBudgets").get("items") or [])
            if r.status_code == 200
            else []
        )

    def evict(
        self,
        pod: Mapping[str, Any],
        *,
        timeout: float,
        interval: float = 5.0,
        grace_seconds: int | None = None,
    ) -> str:
        """Evict `pod`; retried while a disruption budget refuses (HTTP 429) until `timeout`.
        Returns one line of what happened."""
        meta = pod.get("metadata") or {}
        ns, name = str(meta.get("namespace")), str(meta.get("name"))
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": ns},
        }
        if grace_seconds is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": grace_seconds}
        path = f"/api/v1/namespaces/{quote(ns, safe='')}/pods/{quote(name, safe='')}/eviction"
        deadline = self.clock() + timeout
        while True:
            r = self.request("POST", path, body)
            if r.status_code in (200, 201):
                return f"evicted {ns}/{name}"
            if r.status_code == 404:
                return f"{ns}/{name} is gone already"
            if r.status_code != 429:
                raise NodeprepError(
                    f"{self.cfg.server}: evicting pod {ns}/{name} failed (HTTP {r.status_code} "
                    f"{status_message(r)})"
                )
            if self.clock() >= deadline:
                raise EvictionBlocked(
                    f"evicting pod {ns}/{name} blocked for {timeout:.0f}s by {self.blocking_budget(pod, r)}: "
                    f"{status_message(r)}",
                    hint="the node stays cordoned; raise the budget or move the pod, then re-run",
                )
            self.sleep(min(interval, max(0.0, deadline - self.clock())))

    def blocking_budget(self, pod: Mapping[str, Any], refusal: requests.Response) -> str:
        """'PodDisruptionBudget NS/NAME' from the refusal's causes, else from the namespace's budgets
        whose selector matches the pod."""
        meta = pod.get("metadata") or {}
        ns = str(meta.get("namespace"))
        try:
            causes = ((refusal.json().get("details") or {}).get("causes")) or []
        except ValueError:
            causes = []
        names = []
        for b in self.budgets(ns):
            bname = str((b.get("metadata") or {}).get("name"))
            if any(bname in str(c.get("message", "")) for c in causes if isinstance(c, dict)) or selects(
                (b.get("spec") or {}).get("selector"), meta.get("labels") or {}
            ):
                names.append(bname)
        return (
            ", ".join(f"PodDisruptionBudget {ns}/{n}" for n in sorted(set(names))) or "a PodDisruptionBudget"
        )

    def wait_gone(
        self, pods: Sequence[Mapping[str, Any]], *, timeout: float, interval: float = 1.0
    ) -> list[str]:
        """Wait until each pod (by namespace, name and uid) no longer exists; the ones left at timeout."""
        deadline = self.clock() + timeout
        left = list(pods)
        while True:
            still = []
            for p in left:
                meta = p.get("metadata") or {}
                now = self.pod(str(meta.get("namespace")), str(meta.get("name")))
                if now is not None and (now.get("metadata") or {}).get("uid") == meta.get("uid"):
                    still.append(p)
            left = still
            if not left or self.clock() >= deadline:
                return [
                    f"{(p.get('metadata') or {}).get('namespace')}/{(p.get('metadata') or {}).get('name')}"
                    for p in left
                ]
            self.sleep(interval)


def selects(selector: Any, labels: Mapping[str, Any]) -> bool:
    """Whether a LabelSelector (matchLabels, matchExpressions) selects `labels`; an empty one selects all."""
    if not isinstance(selector, Mapping):
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


@contextmanager
def connect(
    cfg: KubeConfig, *, clock: Clock = time.monotonic, sleep: Sleep = time.sleep
) -> Iterator[Cluster]:
    with api_session(cfg) as s:
        s.headers["User-Agent"] = "nodeprep-upgrade"
        yield Cluster(cfg, s, clock, sleep)
