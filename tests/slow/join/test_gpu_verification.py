"""Unschedulable until the GPUs are proven, against a real kube-apiserver (v1.24.0-alpha.3, Node,RBAC +
NodeRestriction; tests/support/controlplane.py):

- the node's own credential cannot lift (or change) its `nodeprep.dev/unverified` taint, nor delete its
  Node to register anew; it can publish its self-test verdict label;
- the controller's credential (the ClusterRole in examples/verify-nodes-rbac.yaml) can patch nodes but
  not delete or create them nor read secrets;
- a failed self-test keeps the taint, a passed one lifts it for that node only; a reboot (new boot id)
  makes the verdict stale and the taint comes back; a node that registers without the taint gets it.

GPU facts come from a recorded nvidia-smi capture at that one boundary (no GPU here); the node's sysfs
and driver root are temp directories.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from click.testing import CliRunner

from nodeprep.cli import main
from tests.support.controlplane import ControlPlane
from tests.support.drivertree import driver_node

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
T4 = REPO / "tests/fixtures/nvidia-smi/tesla-t4_515.105.01.xml"
DRIVER = "515.105.01"
TAINT = {"key": "nodeprep.dev/unverified", "effect": "NoSchedule"}
MERGE = "application/merge-patch+json"


def register(cp: ControlPlane, name: str, boot: str, *, tainted: bool = True) -> requests.Session:
    """What the kubelet does with nodeprep's configuration: create its Node with labels and taints,
    then report its boot id in the status."""
    s = cp.node_session(name)
    body = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                  "nodeprep.dev/driver-version": DRIVER}},
            "spec": {"taints": [TAINT] if tainted else []}}
    assert cp.api("POST", "/api/v1/nodes", body, session=s).status_code == 201
    set_boot(cp, s, name, boot)
    return s


def set_boot(cp: ControlPlane, s: requests.Session, name: str, boot: str) -> None:
    r = cp.api("PATCH", f"/api/v1/nodes/{name}/status", {"status": {"nodeInfo": {"bootID": boot}}},
               session=s, content_type=MERGE)
    assert r.status_code == 200, r.text


def node_dirs(tmp_path: Path, boot: str, extra_gpu: bool = False) -> tuple[Path, Path]:
    buses = ["0000:00:1e.0", *(["0000:3b:00.0"] if extra_gpu else [])]
    root, sysfs = driver_node(tmp_path, DRIVER, DRIVER, buses)
    (root / "proc/sys/kernel/random").mkdir(parents=True)
    (root / "proc/sys/kernel/random/boot_id").write_text(boot + "\n")
    return root, sysfs


def verify_gpus(cp: ControlPlane, tmp_path: Path, name: str, boot: str, *, extra_gpu: bool = False,
                ) -> tuple[int, str]:
    root, sysfs = node_dirs(tmp_path / name, boot, extra_gpu)
    r = CliRunner().invoke(main, ["verify-gpus", "--root", str(root), "--sysfs-root", str(sysfs),
                                  "--nvidia-smi-xml", str(T4), "--apply", "--node", name,
                                  "--kubeconfig", str(cp.node_credential(name))], catch_exceptions=False)
    return r.exit_code, r.stderr


def controller_credential(cp: ControlPlane) -> Path:
    """A client certificate for user `nodeprep-verify-nodes`, bound to the shipped ClusterRole."""
    docs = yaml.safe_load_all((REPO / "examples/verify-nodes-rbac.yaml").read_text())
    return cp.user_kubeconfig("nodeprep-verify-nodes", next(d for d in docs if d["kind"] == "ClusterRole"))


def verify_nodes(conf: Path) -> list[str]:
    r = CliRunner().invoke(main, ["verify-nodes", "--kubeconfig", str(conf), "--once"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    return r.stdout.splitlines()


def node(cp: ControlPlane, name: str) -> dict[str, Any]:
    return cp.api("GET", f"/api/v1/nodes/{name}").json()  # type: ignore[no-any-return]


def tainted(cp: ControlPlane, name: str) -> bool:
    return TAINT in [{k: t[k] for k in ("key", "effect")} for t in node(cp, name)["spec"].get("taints", [])]


def test_node_credential_cannot_lift_its_taint(control_plane: ControlPlane) -> None:
    cp, name = control_plane, "np-verify-self"
    s = register(cp, name, str(uuid.uuid4()))
    for taints in ([], [TAINT, {"key": "other", "effect": "NoSchedule"}]):
        r = cp.api("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": taints}}, session=s,
                   content_type=MERGE)
        assert r.status_code == 403 and "is not allowed to modify taints" in r.json()["message"], r.text
    r = cp.api("DELETE", f"/api/v1/nodes/{name}", session=s)
    assert r.status_code == 403 and 'cannot delete resource "nodes"' in r.json()["message"], r.text
    r = cp.api("PATCH", f"/api/v1/nodes/{name}", {"metadata": {"labels": {"nodeprep.dev/gpu-verified": "x"}}},
               session=s, content_type=MERGE)
    assert r.status_code == 200  # the verdict label is one a node may set
    assert tainted(cp, name)


def test_controller_credential_is_limited_to_reading_and_patching_nodes(control_plane: ControlPlane) -> None:
    cp = control_plane
    conf = controller_credential(cp)
    s = cp.user_session("nodeprep-verify-nodes")
    assert cp.api("GET", "/api/v1/nodes", session=s).status_code == 200
    assert cp.api("GET", "/api/v1/nodes?watch=1&timeoutSeconds=1", session=s).status_code == 200
    assert cp.api("DELETE", "/api/v1/nodes/np-verify-self", session=s).status_code == 403
    assert cp.api("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "x"}},
                  session=s).status_code == 403
    assert cp.api("GET", "/api/v1/namespaces/kube-system/secrets", session=s).status_code == 403
    assert cp.api("GET", "/api/v1/pods", session=s).status_code == 403
    assert conf.is_file()


def test_failed_selftest_keeps_the_taint_passed_lifts_it_for_that_node_only(control_plane: ControlPlane,
                                                                            tmp_path: Path) -> None:
    cp = control_plane
    conf = controller_credential(cp)
    good, bad, fresh = "np-verify-good", "np-verify-bad", "np-verify-untainted"
    boot = str(uuid.uuid4())
    s_good = register(cp, good, boot)
    register(cp, bad, boot)
    # A failed self-test (a second GPU on the PCI bus that the driver does not list): exit 1, verdict
    # `failed` published, the problems in the annotation; the taint stays.
    code, err = verify_gpus(cp, tmp_path, bad, boot, extra_gpu=True)
    assert code == 1 and "GPU 0000:3b:00.0 is on the PCI bus but not visible to the driver" in err, err
    assert node(cp, bad)["metadata"]["labels"]["nodeprep.dev/gpu-verified"] == "failed"
    note = json.loads(node(cp, bad)["metadata"]["annotations"]["nodeprep.dev/gpu-selftest"])
    assert note["passed"] is False and len(note["problems"]) == 1
    # Before any verdict, the controller changes nothing on tainted nodes.
    assert not [line for line in verify_nodes(conf) if good in line or bad in line]
    code, err = verify_gpus(cp, tmp_path, good, boot)
    assert code == 0, err
    lines = verify_nodes(conf)
    assert f"node {good}: GPU self-test passed for this boot and driver: taint removed" in lines
    assert not tainted(cp, good) and tainted(cp, bad)
    assert not [line for line in verify_nodes(conf) if good in line or bad in line]  # settled
    # A reboot: the kubelet reports a new boot id; the old verdict no longer counts.
    set_boot(cp, s_good, good, str(uuid.uuid4()))
    lines = verify_nodes(conf)
    assert f"node {good}: no valid GPU verdict (verdict is stale (another boot or driver)): taint added" \
        in lines
    assert tainted(cp, good)
    # A node that registers without the taint (its own credential may create its Node as it likes) gets it.
    register(cp, fresh, boot, tainted=False)
    assert not tainted(cp, fresh)
    assert f"node {fresh}: no valid GPU verdict (no verdict): taint added" in verify_nodes(conf)
    assert tainted(cp, fresh)
