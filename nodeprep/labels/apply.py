"""Write labels onto the Node object through the Kubernetes API (JSON merge patch).

Only labels nodeprep sets are touched. The keys it set last time are remembered in the annotation
`nodeprep.dev/managed-labels`, so a label it no longer produces is removed (set to null) without
touching labels that GFD, a cloud controller or an administrator set, nor the GPU self-test's verdict
(`nodeprep.dev/gpu-verified`, written by `nodeprep verify-gpus`). Conflicts (409) and server
errors (5xx) are retried with a bounded exponential backoff; every attempt re-reads the Node.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests

from ..errors import InputError, NetworkError, NodeprepError
from .core import PREFIX, VERIFIED_LABEL
from .validate import self_settable

log = logging.getLogger(__name__)

MANAGED_ANNOTATION = f"{PREFIX}/managed-labels"
PATCH_TYPE = "application/merge-patch+json"


@dataclass(frozen=True)
class KubeConfig:
    server: str
    ca_file: Path | None = None
    ca_data: bytes | None = None
    insecure: bool = False
    cert_file: Path | None = None
    cert_data: bytes | None = None
    key_file: Path | None = None
    key_data: bytes | None = None
    token: str | None = field(default=None, repr=False)


def _named(items: Any, name: str | None, what: str, path: Path) -> dict[str, Any]:
    if not isinstance(items, list) or not items:
        raise InputError(f"{path}: no {what}s defined")
    for item in items:
        if isinstance(item, dict) and (name is None or item.get("name") == name):
            body = item.get(what)
            if isinstance(body, dict):
                return body
    raise InputError(f"{path}: {what} {name!r} not found")


def load_kubeconfig(path: Path, context: str | None = None) -> KubeConfig:
    """Server, CA and credentials of `context` (default: current-context) in a kubeconfig file."""
    from ..yamlinput import load_yaml

    _, document = load_yaml(path)  # the strict, bounded reader of every user YAML file
    data = document.data
    if not isinstance(data, dict):
        raise InputError(f"{path}: not a kubeconfig (expected a mapping)")
    ctx_name = context or data.get("current-context")
    ctx = _named(data.get("contexts"), ctx_name, "context", path) if data.get("contexts") else {}
    cluster = _named(data.get("clusters"), ctx.get("cluster"), "cluster", path)
    users = data.get("users") or []
    user = _named(users, ctx.get("user"), "user", path) if users else {}
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise InputError(f"{path}: cluster server {server!r} is not an http(s) URL")
    base = path.parent

    def file(value: Any) -> Path | None:
        return (base / value) if isinstance(value, str) and value else None

    def b64(value: Any, name: str) -> bytes | None:
        if not value:
            return None
        try:
            return base64.b64decode(value, validate=True)
        except (ValueError, TypeError):
            raise InputError(f"{path}: {name} is not valid base64") from None

    token = user.get("token")
    if not token and user.get("tokenFile"):
        try:
            token = file(user["tokenFile"]).read_text().strip()  # type: ignore[union-attr]
        except OSError as e:
            raise InputError(f"{path}: cannot read tokenFile ({e.strerror})") from None
    return KubeConfig(
        server=server.rstrip("/"),
        ca_file=file(cluster.get("certificate-authority")),
        ca_data=b64(cluster.get("certificate-authority-data"), "certificate-authority-data"),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        cert_file=file(user.get("client-certificate")),
        cert_data=b64(user.get("client-certificate-data"), "client-certificate-data"),
        key_file=file(user.get("client-key")),
        key_data=b64(user.get("client-key-data"), "client-key-data"),
        token=token or None,
    )


@contextmanager
def api_session(cfg: KubeConfig) -> Iterator[requests.Session]:
    """A requests session honouring the kubeconfig's CA, client certificate/key and token. Inline
    (*-data) credentials go to 0600 files in a private temporary directory, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="nodeprep-kube-") as tmp:
        def materialise(data: bytes | None, fallback: Path | None, name: str) -> str | None:
            if data is None:
                return str(fallback) if fallback else None
            p = Path(tmp) / name
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return str(p)

        s = requests.Session()
        s.trust_env = False
        ca = materialise(cfg.ca_data, cfg.ca_file, "ca.crt")
        s.verify = False if cfg.insecure else (ca or True)
        cert = materialise(cfg.cert_data, cfg.cert_file, "client.crt")
        key = materialise(cfg.key_data, cfg.key_file, "client.key")
        if cert:
            s.cert = (cert, key) if key else cert
        if cfg.token:
            s.headers["Authorization"] = f"Bearer {cfg.token}"
        s.headers["Accept"] = "application/json"
        s.headers["User-Agent"] = "nodeprep-labels"
        try:
            yield s
        finally:
            s.close()


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


def default_node_name() -> str:
    return socket.gethostname().split(".")[0].lower()


def read_node(cfg: KubeConfig, node: str, *, timeout: float = 10.0) -> dict[str, Any]:
    """GET the Node, once (what a `--check` plans against; nothing is written)."""
    url = f"{cfg.server}/api/v1/nodes/{quote(node, safe='')}"
    with api_session(cfg) as s:
        try:
            r = s.get(url, timeout=timeout)
        except requests.exceptions.SSLError as e:
            raise NetworkError(f"{cfg.server}: TLS verification failed ({e})") from None
        except requests.RequestException as e:
            raise NetworkError(f"{cfg.server}: {type(e).__name__}: {e}") from None
    if r.status_code == 404:
        raise InputError(f"node {node!r} not found at {cfg.server}")
    if r.status_code != 200:
        raise NodeprepError(f"{cfg.server}: reading node {node!r} failed (HTTP {r.status_code} "
                            f"{_status_message(r)})")
    try:
        data = r.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise NodeprepError(f"{cfg.server}: node {node!r}: the answer is not a JSON object")
    return data


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
                last = f"HTTP {r.status_code} {_status_message(r)}"
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


def _status_message(r: requests.Response) -> str:
    try:
        return str(r.json().get("message", "")) or r.reason
    except ValueError:
        return r.reason or ""
