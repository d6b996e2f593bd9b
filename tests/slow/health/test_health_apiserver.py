"""The GPU health service against a real kube-apiserver (v1.24.0-alpha.3, Node,RBAC + NodeRestriction;
tests/support/controlplane.py), with NVIDIA's NVML mock as the GPUs (tests/support/mocknvml.py; H100
profile, a fault brought and taken away through the mock's runtime overrides file, which a running
process re-reads): no GPU here.

- `nodeprep health --watch --apply` runs as the node (`system:node:NAME` certificate) and sets the
  condition GPUHealthy on its own Node's status; the node's credential may not set the taint;
- `nodeprep verify-nodes` (the controller's ClusterRole, examples/verify-nodes-rbac.yaml) adds
  nodeprep.dev/gpu-unhealthy:NoSchedule while the condition is False and lifts it when it is True;
- GPU 0 falls off the bus with Xid 79: False with reason XID79 naming index, UUID and PCI address;
  the fault cleared: True again after the hold, taint lifted;
- kube-apiserver stopped and started again: the service keeps running and writes what happened
  meanwhile once the API server is back;
- one look (`nodeprep health --apply`, `--check`) on the mock's `example-h100-faults`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import mocknvml, procs
from tests.support.controlplane import ControlPlane

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(mocknvml.skip_reason() is not None, reason=str(mocknvml.skip_reason()))]

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests/fixtures/mocknvml"
TAINT = {"key": "nodeprep.dev/gpu-unhealthy", "effect": "NoSchedule"}
MERGE = "application/merge-patch+json"
HOLD = 3


def register(cp: ControlPlane, name: str) -> None:
    s = cp.node_session(name)
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "kubernetes.io/hostname": name, "nodeprep.dev/driver-version": "550.163.01"}}}
    r = cp.api("POST", "/api/v1/nodes", body, session=s)
    assert r.status_code == 201, r.text
    r = cp.api("PATCH", f"/api/v1/nodes/{name}/status",
               {"status": {"nodeInfo": {"bootID": str(uuid.uuid4())}}}, session=s, content_type=MERGE)
    assert r.status_code == 200, r.text


def condition(cp: ControlPlane, name: str) -> dict[str, Any] | None:
    node = cp.api("GET", f"/api/v1/nodes/{name}").json()
    for c in node.get("status", {}).get("conditions") or []:
        if c["type"] == "GPUHealthy":
            return c  # type: ignore[no-any-return]
    return None


def wait_status(cp: ControlPlane, name: str, status: str, what: str, timeout: float = 60,
                interval: float = 0.2) -> dict[str, Any]:
    """The Node's GPUHealthy condition once its status is `status`."""
    def probe() -> dict[str, Any] | None:
        c = condition(cp, name)
        return c if c is not None and c["status"] == status else None

    return cp.wait(what, probe, timeout=timeout, interval=interval)  # type: ignore[no-any-return]


def tainted(cp: ControlPlane, name: str) -> bool:
    node = cp.api("GET", f"/api/v1/nodes/{name}").json()
    return TAINT in [{k: t[k] for k in ("key", "effect")} for t in node["spec"].get("taints", [])]


def controller_credential(cp: ControlPlane) -> Path:
    docs = yaml.safe_load_all((REPO / "examples/verify-nodes-rbac.yaml").read_text())
    return cp.user_kubeconfig("nodeprep-verify-nodes", next(d for d in docs if d["kind"] == "ClusterRole"))


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    started: list[subprocess.Popen[bytes]] = []

    def start(args: list[str], env: dict[str, str], log: str) -> subprocess.Popen[bytes]:
        with (tmp_path / log).open("wb") as out:
            p = subprocess.Popen([sys.executable, "-m", "nodeprep.cli", *args], cwd=REPO, env=env,
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        started.append(p)
        return p

    yield start
    for p in started:
        procs.terminate_group(p)
        procs.wait_or_kill_group(p, 10)


def test_condition_and_taint_follow_a_fault_and_survive_the_api_server(
        control_plane: ControlPlane, test_cache: Path, tmp_path: Path, spawn: Any) -> None:
    cp, name = control_plane, "np-health"
    register(cp, name)
    overrides = tmp_path / "overrides.yaml"
    shutil.copyfile(FIXTURES / "healed.yaml", overrides)
    env = mocknvml.env(test_cache, "h100")
    env["MOCK_NVML_OVERRIDES"] = str(overrides)
    service = spawn(["health", "--watch", "--apply", "--kubeconfig", str(cp.node_credential(name)),
                     "--node", name, "--hold", str(HOLD), "--xid-window", "5", "--interval", "1",
                     "--no-kmsg"],
                    env, "health.log")
    controller = spawn(["verify-nodes", "--kubeconfig", str(controller_credential(cp)), "--interval", "1"],
                       {"PATH": env["PATH"]}, "verify-nodes.log")
    log = tmp_path / "health.log"

    healthy = wait_status(cp, name, "True", "GPUHealthy=True")
    assert healthy["reason"] == "GPUsHealthy" and healthy["message"] == "all 8 GPUs healthy"
    assert not tainted(cp, name)
    # the node's own credential may write its condition but not its taints (NodeRestriction)
    r = cp.api("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": [TAINT]}},
               session=cp.node_session(name), content_type=MERGE)
    assert r.status_code == 403 and "is not allowed to modify taints" in r.json()["message"]

    # GPU 0 falls off the bus, Xid 79 through NVML's event set
    t0 = time.monotonic()
    shutil.copyfile(FIXTURES / "fallen-off-bus.yaml", overrides)
    down = wait_status(cp, name, "False", "GPUHealthy=False", timeout=30, interval=0.1)
    took = time.monotonic() - t0
    assert down["reason"] in ("XID79", "GPULost"), down
    assert "GPU 0 (GPU-01000100-0000-0000-0000-000000000000, 00000000:1A:00.0)" in down["message"]
    cp.wait("XID79 in the message",
            lambda: "Xid 79 GPU has fallen off the bus" in (condition(cp, name) or {}).get("message", ""),
            timeout=10, interval=0.2)
    cp.wait("the unhealthy taint", lambda: tainted(cp, name), timeout=30)
    print(f"fault to condition on the API server: {took:.2f}s")

    # the fault clears: True again only after the hold
    shutil.copyfile(FIXTURES / "healed.yaml", overrides)
    t1 = time.monotonic()
    up = wait_status(cp, name, "True", "GPUHealthy=True again")
    assert time.monotonic() - t1 >= HOLD - 0.5 and up["reason"] == "GPUsHealthy"
    assert up["lastTransitionTime"] >= down["lastTransitionTime"]
    cp.wait("the taint lifted", lambda: not tainted(cp, name), timeout=30)

    # the API server goes away; a fault comes meanwhile; it comes back
    cp.stop_apiserver()
    shutil.copyfile(FIXTURES / "fallen-off-bus.yaml", overrides)
    time.sleep(8)
    assert service.poll() is None, log.read_text()
    cp.start_apiserver()
    again = wait_status(cp, name, "False", "GPUHealthy=False after the restart")
    assert "GPU 0 (GPU-01000100-0000-0000-0000-000000000000" in again["message"]
    cp.wait("the unhealthy taint after the restart",
            lambda: tainted(cp, name) or controller.poll() is not None, timeout=60)
    assert controller.poll() is None, (tmp_path / "verify-nodes.log").read_text()
    text = log.read_text()
    assert "condition not written" in text and "retrying in" in text, text
    assert service.poll() is None and controller.poll() is None
    shutil.copyfile(FIXTURES / "healed.yaml", overrides)
    wait_status(cp, name, "True", "healthy at the end")
    cp.wait("no taint at the end", lambda: not tainted(cp, name), timeout=30)


def test_one_look_applies_and_checks(control_plane: ControlPlane, test_cache: Path) -> None:
    """`nodeprep health --apply` (one look) writes the condition with the node's credential and exits 1
    on the mock's faults; `--check` prints the condition it would write and changes nothing."""
    import json

    cp, name = control_plane, "np-health-once"
    register(cp, name)
    conf = str(cp.node_credential(name))
    env = mocknvml.env(test_cache, "example-h100-faults")
    base = [sys.executable, "-m", "nodeprep.cli", "health", "--json", "--no-kmsg", "--apply", "--kubeconfig",
            conf, "--node", name]
    r = subprocess.run([*base, "--check"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    planned = json.loads(r.stdout)["would_write"]["condition"]
    assert planned["status"] == "False" and planned["reason"] == "RowRemapFailure"
    assert condition(cp, name) is None  # nothing written
    r = subprocess.run(base, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    written = condition(cp, name)
    assert written is not None and written["status"] == "False" and written["reason"] == "RowRemapFailure"
    assert "GPU 2 (GPU-01000100-0000-0000-0000-000000000002, 00000000:4A:00.0): NVML cannot reach the GPU" \
        in written["message"]
    assert f"node {name}: GPUHealthy=False reason RowRemapFailure" in r.stderr
    conditions = cp.api("GET", f"/api/v1/nodes/{name}").json()["status"]["conditions"]
    assert [c["type"] for c in conditions] == ["GPUHealthy"]  # merged by type: nothing else added
