"""`nodeprep upgrade plan/prepare/finish/fail/budget` against a real kube-apiserver (v1.24.0-alpha.3 with
kube-controller-manager, whose disruption controller computes the budgets; tests/support/controlplane.py)
with the credential of examples/upgrade-rbac.yaml (nodes get/list/patch, pods get/list, pods/eviction
create, PDB and ResourceClaim list: no pod delete).

No kubelet runs here: Nodes are created as the kubelet would, pods as objects bound to a node with
spec.nodeName, their status set Running and Ready through the status subresource (as a kubelet
reports), and terminationGracePeriodSeconds 0, so the API server deletes an evicted pod at once instead
of waiting for a kubelet to stop it. Evictions go through the real Eviction API (policy/v1) and the
real disruption controller. The GPU self-test of the validation step is the real `verify-gpus` over a
recorded nvidia-smi capture (no GPU here) and the real `verify-nodes` lifting the taint.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from nodeprep.cli import main
from nodeprep.upgrade import nodeside
from nodeprep.upgrade import states as st
from tests.slow.join.test_gpu_verification import (
    T4,
    controller_credential,
    node_dirs,
    register,
    verify_gpus,
    verify_nodes,
)
from tests.support.controlplane import ControlPlane

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
TARGET = "515.105.01"  # the capture's driver: the validation's self-test passes for it
MERGE = "application/merge-patch+json"


def rollout_credential(cp: ControlPlane) -> Path:
    """A kubeconfig for user nodeprep-upgrade bound to examples/upgrade-rbac.yaml's ClusterRole (once
    the default service account, which pods need, exists)."""
    docs = yaml.safe_load_all((REPO / "examples/upgrade-rbac.yaml").read_text())
    cp.wait(
        "the default service account (pods need it)",
        lambda: cp.api("GET", "/api/v1/namespaces/default/serviceaccounts/default").status_code == 200,
    )
    return cp.user_kubeconfig("nodeprep-upgrade", next(d for d in docs if d["kind"] == "ClusterRole"))


@pytest.fixture(scope="module")
def upgrader(control_plane: ControlPlane) -> Path:
    return rollout_credential(control_plane)


def cli(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, list(args))
    return r.exit_code, r.stdout, r.stderr


def upgrade(conf: Path, verb: str, name: str, *extra: str) -> tuple[int, dict[str, Any], str]:
    code, out, err = cli(
        "upgrade", verb, "--kubeconfig", str(conf), "--node", name, "--version", TARGET, "--json", *extra
    )
    return code, (json.loads(out) if out.strip() else {}), err


def make_node(cp: ControlPlane, name: str, *, unschedulable: bool = False) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "nodeprep.dev/driver-version": "470.256.02"},
        },
        "spec": {"unschedulable": unschedulable},
    }
    r = cp.api("POST", "/api/v1/nodes", body)
    assert r.status_code == 201, r.text


def make_pod(
    cp: ControlPlane,
    node: str,
    name: str,
    *,
    gpu: bool,
    labels: dict[str, str] | None = None,
    ns: str = "default",
) -> dict[str, Any]:
    res = {"limits": {"nvidia.com/gpu": "1"}} if gpu else {"requests": {"cpu": "10m"}}
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "registry.invalid/app:1", "resources": res}],
        },
    }
    r = cp.api("POST", f"/api/v1/namespaces/{ns}/pods", body)
    assert r.status_code == 201, r.text
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = {
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
        }
    }
    r = cp.api("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", status, content_type=MERGE)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def budgeted_gpu_node(cp: ControlPlane, name: str) -> None:
    """Node `name` running GPU pod `name`-train, which PodDisruptionBudget `name`-budget (minAvailable
    1) covers."""
    make_node(cp, name)
    make_pod(cp, name, f"{name}-train", gpu=True, labels={"app": name})
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": f"{name}-budget"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": name}}},
    }
    assert cp.api("POST", "/apis/policy/v1/namespaces/default/poddisruptionbudgets", pdb).status_code == 201


def pod_exists(cp: ControlPlane, name: str, ns: str = "default") -> bool:
    return cp.api("GET", f"/api/v1/namespaces/{ns}/pods/{name}").status_code == 200


def node(cp: ControlPlane, name: str) -> dict[str, Any]:
    return cp.api("GET", f"/api/v1/nodes/{name}").json()  # type: ignore[no-any-return]


def view(cp: ControlPlane, name: str) -> st.NodeView:
    return st.view(node(cp, name))


def uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def test_only_the_gpu_pod_is_evicted_and_a_second_run_changes_nothing(
    control_plane: ControlPlane, upgrader: Path
) -> None:
    cp, name = control_plane, uniq("up-gpu")
    make_node(cp, name)
    make_pod(cp, name, f"{name}-train", gpu=True)
    make_pod(cp, name, f"{name}-web", gpu=False)
    code, plan, err = upgrade(upgrader, "prepare", name, "--check")
    assert code == 0, err
    assert plan["evicted"] == [f"default/{name}-train"] and view(cp, name).state is None  # nothing written
    code, res, err = upgrade(upgrader, "prepare", name)
    assert code == 0, err
    assert res["state"] == st.POD_RESTART and res["evicted"] == [f"default/{name}-train"]
    assert res["kept"] == [f"default/{name}-web (uses no GPU)"]
    assert not pod_exists(cp, f"{name}-train") and pod_exists(cp, f"{name}-web")
    v = view(cp, name)
    assert (
        v.state == "pod-restart-required" and v.unschedulable and v.cordoned_by_rollout and v.target == TARGET
    )
    code, res, err = upgrade(upgrader, "finish", name, "--no-selftest")
    assert code == 0, err
    v = view(cp, name)
    assert v.state == "upgrade-done" and not v.unschedulable and not v.cordoned_by_rollout
    for verb in ("prepare", "finish"):  # the second run
        before = node(cp, name)["metadata"]["resourceVersion"]
        code, res, err = upgrade(upgrader, verb, name, *(["--no-selftest"] if verb == "finish" else []))
        assert code == 0 and res["changed"] is False and res["state"] == "upgrade-done", (res, err)
        assert node(cp, name)["metadata"]["resourceVersion"] == before


def test_a_disruption_budget_blocks_then_fails_naming_it(control_plane: ControlPlane, upgrader: Path) -> None:
    cp, name = control_plane, uniq("up-pdb")
    budgeted_gpu_node(cp, name)
    cp.wait(
        "the disruption controller's status",
        lambda: (
            (
                cp.api("GET", f"/apis/policy/v1/namespaces/default/poddisruptionbudgets/{name}-budget")
                .json()
                .get("status")
                or {}
            ).get("currentHealthy")
            == 1
        ),
    )
    started = time.monotonic()
    code, _, err = upgrade(upgrader, "prepare", name, "--timeout", "6", "--interval", "1")
    waited = time.monotonic() - started
    assert code == 1 and waited >= 6, (code, err)
    blocked = f"blocked for 6s by PodDisruptionBudget default/{name}-budget"
    assert f"error: evicting pod default/{name}-train {blocked}" in err, err
    assert pod_exists(cp, f"{name}-train")
    v = view(cp, name)
    assert v.state == "upgrade-failed" and v.unschedulable and v.cordoned_by_rollout  # left cordoned
    assert v.reason is not None and f"PodDisruptionBudget default/{name}-budget" in v.reason


def test_a_node_cordoned_beforehand_stays_cordoned(control_plane: ControlPlane, upgrader: Path) -> None:
    cp, name = control_plane, uniq("up-ops")
    make_node(cp, name, unschedulable=True)  # cordoned by someone else, for their own reason
    code, res, err = upgrade(upgrader, "prepare", name)
    assert code == 0, err
    assert any("not uncordoned afterwards" in line for line in res["lines"])
    code, res, err = upgrade(upgrader, "finish", name, "--no-selftest")
    assert code == 0, err
    assert "left cordoned: this rollout did not cordon it" in res["lines"]
    v = view(cp, name)
    assert v.state == "upgrade-done" and v.unschedulable and not v.cordoned_by_rollout


def test_an_interrupted_eviction_resumes_where_it_stopped(
    control_plane: ControlPlane, upgrader: Path
) -> None:
    """The first run is killed (SIGINT) while a budget blocks its eviction; the re-run, once the budget
    is gone, goes on from pod-deletion-required and does not cordon again."""
    cp, name = control_plane, uniq("up-int")
    budgeted_gpu_node(cp, name)
    argv = [
        sys.executable,
        "-m",
        "nodeprep",
        "upgrade",
        "prepare",
        "--kubeconfig",
        str(upgrader),
        "--node",
        name,
        "--version",
        TARGET,
        "--interval",
        "1",
        "--timeout",
        "120",
    ]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        cp.wait(
            "the first run to reach the eviction", lambda: view(cp, name).state == "pod-deletion-required"
        )
        time.sleep(2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, err
    v = view(cp, name)
    assert v.state == "pod-deletion-required" and v.unschedulable and v.cordoned_by_rollout
    assert pod_exists(cp, f"{name}-train")
    assert cp.api("DELETE", f"/apis/policy/v1/namespaces/default/poddisruptionbudgets/{name}-budget").ok
    code, res, err = upgrade(upgrader, "prepare", name)
    assert code == 0, err
    assert "cordoned" not in res["lines"] and res["evicted"] == [f"default/{name}-train"]
    assert res["lines"][0].startswith(f"evicted default/{name}-train")
    assert view(cp, name).state == "pod-restart-required"


def test_validation_waits_for_the_gpu_self_test_then_uncordons(
    control_plane: ControlPlane, upgrader: Path, tmp_path: Path
) -> None:
    cp, name, boot = control_plane, uniq("up-val"), str(uuid.uuid4())
    register(cp, name, boot)  # as nodeprep's kubelet config registers it: tainted unverified, driver label
    assert upgrade(upgrader, "prepare", name)[0] == 0
    code, _, err = upgrade(upgrader, "finish", name, "--validation-timeout", "2")
    assert code == 1 and "validation failed" in err and "no GPU self-test verdict" in err, err
    assert view(cp, name).state == "validation-required" and view(cp, name).unschedulable
    code, _ = verify_gpus(cp, tmp_path, name, boot)  # the node's self-test (recorded capture) publishes
    assert code == 0
    assert any(name in line for line in verify_nodes(controller_credential(cp)))  # the taint lifted
    code, res, err = upgrade(upgrader, "finish", name, "--validation-timeout", "30")
    assert code == 0, err
    assert res["lines"][0] == "GPU self-test passed (taint lifted)"
    v = view(cp, name)
    assert v.state == "upgrade-done" and not v.unschedulable


def test_failed_nodes_pause_the_rollout_at_the_budget(control_plane: ControlPlane, upgrader: Path) -> None:
    cp = control_plane
    names = [uniq("up-bud") for _ in range(4)]
    for n in names:
        make_node(cp, n)
    for n in names[:2]:
        code, res, err = upgrade(upgrader, "fail", n, "--reason", "doctor: nvidia 515.105.01 not loaded")
        assert code == 0 and res["state"] == "upgrade-failed", err
        assert view(cp, n).reason == "doctor: nvidia 515.105.01 not loaded"
    common = ["--kubeconfig", str(upgrader), "--node", ",".join(names), "--version", TARGET]
    code, out, err = cli(
        "upgrade",
        "plan",
        *common,
        "--failure-budget",
        "3",
        "--batch",
        "50%",
        "--max-unavailable",
        "100%",
        "--mark",
        "--json",
    )
    assert code == 0, err
    doc = json.loads(out)
    assert doc["failed"] == names[:2] and doc["batches"] == [names[2:]] and doc["marked"] == names[2:]
    assert view(cp, names[2]).state == "upgrade-required"
    code, out, err = cli("upgrade", "budget", *common, "--failure-budget", "2")
    assert code == 1
    assert (
        err.strip() == f"error: rollout paused: 2 failed node(s) reach the failure budget 2: "
        f"{', '.join(sorted(names[:2]))}"
    )
    code, out, err = cli("upgrade", "plan", *common, "--failure-budget", "2")
    assert code == 1 and "rollout paused" in err


def test_max_unavailable_counts_nodes_cordoned_by_others(control_plane: ControlPlane, upgrader: Path) -> None:
    cp = control_plane
    names = [uniq("up-mu") for _ in range(5)]
    for i, n in enumerate(names):
        make_node(cp, n, unschedulable=i == 4)
    code, out, err = cli(
        "upgrade",
        "plan",
        "--kubeconfig",
        str(upgrader),
        "--node",
        ",".join(names[:4]),
        "--node",
        names[4],
        "--version",
        TARGET,
        "--batch",
        "3",
        "--max-unavailable",
        "2",
        "--json",
    )
    assert code == 0, err
    doc = json.loads(out)
    # the cordoned node goes first (it costs nothing) and fills a batch with one more
    assert doc["batches"] == [[names[4], names[0], names[1]], [names[2], names[3]]], doc


def test_the_node_side_self_test_publishes_the_verdict_finish_waits_for(
    control_plane: ControlPlane, upgrader: Path, tmp_path: Path
) -> None:
    """nodeprep.upgrade.nodeside.selftest (the module's action selftest) over a tree with the recorded
    capture: --check publishes nothing, the real run publishes the verdict with the node's credential,
    verify-nodes lifts the taint and finish completes."""
    cp, name, boot = control_plane, uniq("up-st"), str(uuid.uuid4())
    register(cp, name, boot)
    assert upgrade(upgrader, "prepare", name)[0] == 0
    root, sysfs = node_dirs(tmp_path / name, boot)
    args = {"kubeconfig": cp.node_credential(name), "node": name, "sysfs_root": sysfs, "nvidia_smi_xml": T4}
    planned = nodeside.selftest(root, check=True, **args)
    assert (
        planned.passed
        and planned.check
        and "nodeprep.dev/gpu-verified" not in node(cp, name)["metadata"]["labels"]
    )
    res = nodeside.selftest(root, **args)
    assert res.passed and node(cp, name)["metadata"]["labels"]["nodeprep.dev/gpu-verified"] == res.label
    verify_nodes(controller_credential(cp))
    code, out, err = upgrade(upgrader, "finish", name, "--validation-timeout", "30")
    assert code == 0 and out["state"] == "upgrade-done", err


def test_a_batch_is_re_planned_from_the_cluster_before_it_starts(
    control_plane: ControlPlane, upgrader: Path
) -> None:
    """`nodeprep upgrade admit`: planned as batches of 2 under max_unavailable 3, the second batch (n2,
    n3) is about to start when someone has cordoned n0 and n1 has failed (left cordoned, as the rollout
    leaves it): one node of room is left, so n2 starts and n3 waits; with a budget of 1 nothing starts."""
    cp = control_plane
    names = [uniq("up-adm") for _ in range(4)]
    for n in names:
        make_node(cp, n, unschedulable=n in names[:2])
    code, res, err = upgrade(upgrader, "fail", names[1], "--reason", "doctor gate")
    assert code == 0, err
    common = ["--kubeconfig", str(upgrader), "--node", ",".join(names), "--version", TARGET]
    batch = ["--batch-nodes", ",".join(names[2:]), "--max-unavailable", "3"]
    code, out, err = cli("upgrade", "admit", *common, *batch, "--failure-budget", "2", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["admitted"] == [names[2]] and doc["waiting"] == [names[3]], doc
    assert doc["unavailable"] == names[:2] and doc["failed"] == [names[1]] and not doc["paused"]
    code, out, err = cli("upgrade", "admit", *common, *batch, "--failure-budget", "2")
    assert code == 0, err
    print(out)
    assert out.splitlines()[0] == f"admitted: {names[2]}"
    code, out, err = cli("upgrade", "admit", *common, *batch, "--failure-budget", "1")
    assert code == 1 and f"rollout paused: 1 failed node(s) reach the failure budget 1: {names[1]}" in err
    assert all(view(cp, n).state is None for n in (names[0], names[2], names[3]))  # it only reads
