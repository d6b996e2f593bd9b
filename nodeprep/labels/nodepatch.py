"""Write labels onto the Node object through the Kubernetes API (JSON merge patch).

Only labels nodeprep sets are touched. The keys it set last time are remembered in the annotation
`nodeprep.dev/managed-labels`, so a label it no longer produces is removed (set to null) without
touching labels that GFD, a cloud controller or an administrator set, nor the GPU self-test's verdict
(`nodeprep.dev/gpu-verified`, written by `nodeprep verify-gpus`). Conflicts (409) and server
errors (5xx) are retried with a bounded exponential backoff; every attempt re-reads the Node.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import requests

from ..errors import InputError, NetworkError, NodeprepError
from ..kubeapi import PATCH_TYPE, KubeConfig, api_session, status_message
from .core import PREFIX, VERIFIED_LABEL
from .validate import self_settable

log = logging.getLogger(__name__)

MANAGED_ANNOTATION = f"{PREFIX}/managed-labels"


def plan_patch(node: Mapping[str, Any], wanted: Mapping[str, str],
               may_set: Callable[[str], bool] | None = None) -> dict[str, Any] | None:
    """The merge patch that makes the Node carry `wanted` and drops labels nodeprep set before but no
    longer produces; None when nothing would change. With `may_set`, only keys it accepts are added,
    changed or removed (the others are left as they are and stay recorded as nodeprep's)."""
    meta = node.get("metadata") or {}
    current: dict[str, str] = meta.get("labels") or {}
    annotations: dict[str, str] = meta.get("annotations") or {}
    try:
        recorded = set(json.loads(annotations.get(MANAGED_ANNOTATION, "[]")))
    except (ValueError, TypeError):
        recorded = set()
    previous = (recorded | {k for k in current if k.startswith(PREFIX + "/")}) - {VERIFIED_LABEL}
    labels: dict[str, str | None] = {k: v for k, v in wanted.items() if current.get(k) != v}
    labels.update({k: None for k in sorted(previous - set(wanted)) if k in current})
    keys = set(wanted)
    if may_set is not None:
        labels = {k: v for k, v in labels.items() if may_set(k)}
        keys = {k for k in wanted if may_set(k) or current.get(k) == wanted[k]}
        keys |= {k for k in recorded if not may_set(k) and k in current}
    managed = json.dumps(sorted(keys), separators=(",", ":"))
    if not labels and MANAGED_ANNOTATION in annotations and recorded == keys:
        return None
    patch: dict[str, Any] = {"metadata": {"annotations": {MANAGED_ANNOTATION: managed}}}
    if labels:
        patch["metadata"]["labels"] = labels
    if meta.get("resourceVersion"):
        patch["metadata"]["resourceVersion"] = meta["resourceVersion"]  # optimistic concurrency
    return patch


def restricted_keys(patch: Mapping[str, Any] | None) -> list[str]:
    """Label keys in `patch` that NodeRestriction refuses from a node's own credential."""
    labels = ((patch or {}).get("metadata") or {}).get("labels") or {}
    return sorted(k for k in labels if not self_settable(k))


@dataclass(frozen=True)
class ApplyResult:
    """`refused`: labels the credential was not allowed to set (NodeRestriction: a node's own
    credential); everything else was applied."""

    node: str
    changed: bool
    patch: dict[str, Any] | None
    attempts: int
    refused: tuple[str, ...] = ()

    def refused_line(self) -> str | None:
        if not self.refused:
            return None
        return (f"node {self.node}: not applied: {', '.join(self.refused)} — NodeRestriction refuses these "
                "labels from the node's own credential; apply them with a credential meant for it (an "
                "admin or controller kubeconfig: nodeprep labels --apply --kubeconfig FILE)")


def apply_labels(cfg: KubeConfig, node: str, labels: Mapping[str, str], *, attempts: int = 6,
                 backoff: float = 0.2, max_backoff: float = 3.0, timeout: float = 10.0) -> ApplyResult:
    """GET the Node, PATCH its labels; retry 409 and 5xx (and connection errors) with backoff.

    The whole change goes in one patch first. When it is refused (403) and it holds labels only an
    API client may set (`validate.self_settable`: node-role.kubernetes.io/*, other kubernetes.io and
    k8s.io keys, node-restriction.kubernetes.io/*), the credential is taken to be the node's own: the
    patch is sent again without them and they are returned in `ApplyResult.refused`. The API server
    refuses a patch as a whole, so nothing is half-applied either way."""
    url = f"{cfg.server}/api/v1/nodes/{quote(node, safe='')}"
    last = ""
    may_set: Callable[[str], bool] | None = None
    refused: tuple[str, ...] = ()
    with api_session(cfg) as s:
        for attempt in range(1, attempts + 1):
            try:
                r = s.get(url, timeout=timeout)
                if r.status_code == 200:
                    current = r.json()
                    while True:  # the whole change, then (once, after a 403) the self-settable part
                        patch = plan_patch(current, labels, may_set)
                        if patch is None:
                            return ApplyResult(node, False, None, attempt, refused)
                        r = s.patch(url, data=json.dumps(patch), timeout=timeout,
                                    headers={"Content-Type": PATCH_TYPE})
                        if r.status_code == 200:
                            return ApplyResult(node, True, patch, attempt, refused)
                        if not (r.status_code == 403 and may_set is None and restricted_keys(patch)):
                            break
                        refused = tuple(restricted_keys(patch))
                        may_set = self_settable
                        log.info("labels: %s refused (HTTP 403); applying the rest", ", ".join(refused))
            except requests.exceptions.SSLError as e:
                raise NetworkError(f"{cfg.server}: TLS verification failed ({e})") from None
            except requests.RequestException as e:
                last = f"{type(e).__name__}: {e}"
            else:
                last = f"HTTP {r.status_code} {status_message(r)}"
                if r.status_code == 404:
                    raise InputError(f"node {node!r} not found at {cfg.server}")
                if r.status_code in (401, 403):
                    raise NodeprepError(f"{cfg.server}: not allowed to patch node {node!r} ({last})")
                if r.status_code != 409 and r.status_code < 500:
                    raise NodeprepError(f"{cfg.server}: patching node {node!r} failed ({last})")
            if attempt < attempts:
                delay = min(max_backoff, backoff * 2 ** (attempt - 1))
                log.info("labels: %s; retrying in %.1fs", last, delay)
                time.sleep(delay)
    raise NetworkError(f"{cfg.server}: patching node {node!r} failed after {attempts} attempts ({last})")
