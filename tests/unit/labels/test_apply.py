"""`--apply`: what a real API server cannot be made to do on demand.

Everything a real kube-apiserver can answer (patch semantics, NodeRestriction, 404/401/403, TLS and
client certificates, tokens) is tested against one in tests/slow/labels/test_labels_apiserver.py. Here
a loopback http.server stands in for it only to answer 409 Conflict and 5xx first — a real server
cannot be made to return those at a chosen request — and to count the retries.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeprep.errors import InputError, NetworkError
from nodeprep.kubeapi import load_kubeconfig
from nodeprep.labels.nodepatch import (
    MANAGED_ANNOTATION,
    apply_labels,
    plan_patch,
    restricted_keys,
)
from nodeprep.labels.validate import self_settable

from .conftest import Recorded, Server

NODE = "gpu-node-1"
TOKEN = "s3cr3t-token"


def node_object(labels: dict[str, str], managed: list[str] | None = None, rv: str = "100") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": NODE, "resourceVersion": rv, "labels": labels}
    if managed is not None:
        meta["annotations"] = {MANAGED_ANNOTATION: json.dumps(managed)}
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta}


def apiserver(fail_first: int | None = None, labels: dict[str, str] | None = None,
              managed: list[str] | None = None,
              ) -> Callable[[Server, Recorded], tuple[int, dict[str, str], str]]:
    def handle(srv: Server, req: Recorded) -> tuple[int, dict[str, str], str]:
        if req.headers.get("authorization") != f"Bearer {TOKEN}":
            return 401, {}, json.dumps({"kind": "Status", "message": "Unauthorized"})
        if req.path != f"/api/v1/nodes/{NODE}":
            return 404, {}, json.dumps({"kind": "Status", "message": f"nodes {req.path!r} not found"})
        rv = str(100 + srv.state.get("patches", 0))
        if req.method == "GET":
            return 200, {"Content-Type": "application/json"}, json.dumps(
                node_object(labels or {}, managed, rv))
        if req.method == "PATCH":
            if req.headers.get("content-type") != "application/merge-patch+json":
                return 415, {}, json.dumps({"message": "unsupported media type"})
            srv.state["patches"] = srv.state.get("patches", 0) + 1
            if fail_first and srv.state["patches"] == 1:
                return fail_first, {}, json.dumps(
                    {"kind": "Status", "message": "the object has been modified"})
            return 200, {"Content-Type": "application/json"}, json.dumps(node_object({}))
        return 405, {}, ""

    return handle


def kubeconfig(tmp_path: Path, server: str, **user: Any) -> Path:
    path = tmp_path / "admin.conf"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "admin@test",
        "clusters": [{"name": "other", "cluster": {"server": "https://127.0.0.1:1"}},
                     {"name": "test", "cluster": {"server": server}}],
        "contexts": [{"name": "admin@test", "context": {"cluster": "test", "user": "admin"}}],
        "users": [{"name": "admin", "user": user or {"token": TOKEN}}],
    }))
    return path


WANTED = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8",
          "nodeprep.dev/driver-version": "550.127.05", "node.kubernetes.io/instance-type": "p5.48xlarge"}


@pytest.mark.parametrize("status", [409, 500])
def test_retries_conflict_and_server_errors(status: int, http_server: Callable[..., Server],
                                            tmp_path: Path) -> None:
    srv = http_server(apiserver(fail_first=status))
    result = apply_labels(load_kubeconfig(kubeconfig(tmp_path, srv.url)), NODE, WANTED, backoff=0.01)
    assert result.changed and result.attempts == 2
    assert [r.method for r in srv.requests] == ["GET", "PATCH", "GET", "PATCH"]


def test_gives_up_after_bounded_attempts(http_server: Callable[..., Server], tmp_path: Path) -> None:
    srv = http_server(lambda s, r: (503, {}, json.dumps({"message": "etcd unavailable"})))
    with pytest.raises(NetworkError, match="failed after 3 attempts .*HTTP 503 etcd unavailable"):
        apply_labels(load_kubeconfig(kubeconfig(tmp_path, srv.url)), NODE, WANTED, attempts=3, backoff=0.01)
    assert len(srv.requests) == 3


def test_bad_kubeconfig(tmp_path: Path) -> None:
    p = tmp_path / "kc"
    p.write_text("clusters: [{name: a, cluster: {server: ftp://x}}]\n")
    with pytest.raises(InputError, match="is not an http\\(s\\) URL"):
        load_kubeconfig(p)
    with pytest.raises(InputError, match="missing: file not found"):
        load_kubeconfig(tmp_path / "missing")
    p.write_text("clusters: [{name: a, cluster: {server: 'https://x'}}]\n"
                 "users: [{name: u, user: {tokenFile: [1]}}]\n"
                 "contexts: [{name: c, context: {cluster: a, user: u}}]\ncurrent-context: c\n")
    with pytest.raises(InputError, match="tokenFile is not a file name"):  # was an AttributeError
        load_kubeconfig(p)


def test_plan_patch_pure() -> None:
    node = node_object({"a.io/x": "1"}, managed=["a.io/x", "a.io/gone"])
    assert plan_patch(node, {"a.io/x": "1"}) == {
        "metadata": {"annotations": {MANAGED_ANNOTATION: '["a.io/x"]'}, "resourceVersion": "100"}}
    assert plan_patch(node_object({"a.io/x": "1"}, managed=["a.io/x"]), {"a.io/x": "1"}) is None


def test_plan_patch_limited_to_what_the_credential_may_set() -> None:
    """With `may_set`, keys it refuses are neither added nor removed, and stay recorded as ours."""
    node = node_object({"node-role.kubernetes.io/old": "", "a.io/x": "0"},
                       managed=["node-role.kubernetes.io/old", "a.io/x"])
    wanted = {"a.io/x": "1", "node-role.kubernetes.io/gpu": ""}
    full = plan_patch(node, wanted)
    assert full is not None and restricted_keys(full) == ["node-role.kubernetes.io/gpu",
                                                          "node-role.kubernetes.io/old"]
    mine = plan_patch(node, wanted, self_settable)
    assert mine is not None and mine["metadata"]["labels"] == {"a.io/x": "1"}
    assert json.loads(mine["metadata"]["annotations"][MANAGED_ANNOTATION]) == [
        "a.io/x", "node-role.kubernetes.io/old"]
