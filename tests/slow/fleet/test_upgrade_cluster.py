"""playbooks/upgrade-driver.yml against three SSH test hosts and a real kube-apiserver (v1.24.0-alpha.3,
tests/support/controlplane.py), the cluster steps run on the controller with the credential of
examples/upgrade-rbac.yaml.

No kubelet runs here: the Nodes node1..node3 are API objects, the pods objects bound to node3 with
spec.nodeName, Running and Ready set through the status subresource, terminationGracePeriodSeconds 0
(the API server deletes an evicted pod at once). The driver goes into an image root on each host (no
GPU, no module for the CI kernel: the reload step decides for an image and loads nothing; the doctor
gate runs its state and ldcache checks), so validation is the doctor gate (upgrade_gpu_selftest false;
the self-test's taint is covered in tests/slow/upgrade/test_rollout_apiserver.py).

One rollout, batch 1, failure budget 1: node2 was cordoned by someone else (it goes first: it costs no
capacity) and stays cordoned; node1's store serves a corrupted artifact: its install fails, nothing
switched, it is labelled upgrade-failed with the reason and left cordoned, and the rollout pauses at
the budget; node3 never started. The re-run with budget 2 resumes: node1 stays failed, node2 stays done,
node3 is upgraded with only its GPU pod evicted. Before that re-run, a run is interrupted (killed
after 60 s while a PodDisruptionBudget blocks node3's eviction): node3 stays in pod-deletion-required,
cordoned by the rollout, on its old driver, and the re-run resumes it there. A third run changes
nothing (changed=0).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nodeprep.errors import CommandError
from nodeprep.upgrade import states as st
from tests.slow.upgrade.test_rollout_apiserver import (
    make_node,
    make_pod,
    pod_exists,
    rollout_credential,
    view,
)
from tests.support import testhosts
from tests.support.controlplane import ControlPlane

from .conftest import IMAGE_ROOT, Store, fleet_vars, write_inventory
from .test_upgrade import _corrupt_copy, _state

pytestmark = pytest.mark.slow

MERGE = "application/merge-patch+json"


def test_rollout_with_a_cluster(
    fleet3: testhosts.Fleet,
    upgrade_store: Store,
    source_snapshot: Path,
    tmp_path: Path,
    control_plane: ControlPlane,
) -> None:
    cp = control_plane
    old, new = upgrade_store.versions
    served = tmp_path / "served"
    served.mkdir()
    (served / "good").symlink_to(upgrade_store.path)
    _corrupt_copy(upgrade_store.path, served / "bad", f"nvidia-userspace-{new}-amd64.tar.zst")
    node1, node2, node3 = fleet3.hosts
    conf = rollout_credential(cp)
    for h in fleet3.hosts:
        make_node(cp, h.name, unschedulable=h is node2)
    make_pod(cp, node3.name, "train", gpu=True)
    make_pod(cp, node3.name, "web", gpu=False)
    with testhosts.serve_directory(served, fleet3) as urls:
        host_vars = {
            h.name: {"nvidia_driver_store": urls[h.name] + ("/bad" if h is node1 else "/good")}
            for h in fleet3.hosts
        }
        group_vars = fleet_vars(tmp_path, source_snapshot, old, kernel=upgrade_store.kernel)
        inventory = write_inventory(fleet3, tmp_path / "inventory.yml", group_vars, host_vars)
        first = testhosts.ansible_playbook(fleet3, "playbooks/upgrade-driver.yml", inventory)
        assert first.returncode == 0, first.output[-6000:]
        cluster = {"nvidia_driver_version": new, "upgrade_kubeconfig": str(conf), "upgrade_drain_timeout": 30}

        check = testhosts.ansible_playbook(
            fleet3, "playbooks/upgrade-driver.yml", inventory, extra_vars=cluster, args=["--check"]
        )
        assert check.returncode == 0, check.output[-6000:]
        order = [check.output.find(f'"batch: {h}') for h in ("node2", "node1", "node3")]
        assert -1 < order[0] < order[1] < order[2], check.output[-4000:]  # the cordoned node first
        assert all(view(cp, h.name).state is None for h in fleet3.hosts)  # --check wrote nothing
        assert pod_exists(cp, "train")

        paused = testhosts.ansible_playbook(
            fleet3, "playbooks/upgrade-driver.yml", inventory, extra_vars=cluster
        )
        print("install:", first.recap, "\npaused:", paused.recap)
        assert paused.returncode != 0, paused.output[-6000:]
        assert "rollout paused: 1 failed node(s) reach the failure budget 1: node1" in paused.output, (
            paused.output[-4000:]
        )
        assert paused.recap["node1"]["failed"] == 1 and paused.recap["node2"]["failed"] == 0, paused.recap
        assert paused.recap.get("node3", {}).get("ok", 0) == 0, paused.recap  # never started
        v1, v2, v3 = (view(cp, h.name) for h in fleet3.hosts)
        assert (
            v2.state == st.DONE and v2.unschedulable and not v2.cordoned_by_rollout
        )  # someone else's cordon
        assert v1.state == st.FAILED and v1.unschedulable and v1.cordoned_by_rollout  # left cordoned
        assert v1.reason is not None and ("sha256" in v1.reason or "does not match" in v1.reason), v1.reason
        assert v3.state == st.REQUIRED and not v3.unschedulable  # marked by the plan, not begun
        assert _state(node2)["active"] == new
        assert _state(node1)["active"] == old and new not in _state(node1)["installed"]  # nothing switched
        assert _state(node3)["active"] == old and pod_exists(cp, "train")

        # an interrupted run: a budget blocks node3's GPU pod; the run is killed while it waits
        r = cp.api(
            "PATCH",
            "/api/v1/namespaces/default/pods/train",
            {"metadata": {"labels": {"app": "train"}}},
            content_type=MERGE,
        )
        assert r.status_code == 200, r.text
        pdb = {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "train"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "train"}}},
        }
        assert (
            cp.api("POST", "/apis/policy/v1/namespaces/default/poddisruptionbudgets", pdb).status_code == 201
        )
        cp.wait(
            "the budget's status",
            lambda: (
                (
                    cp.api("GET", "/apis/policy/v1/namespaces/default/poddisruptionbudgets/train")
                    .json()
                    .get("status")
                    or {}
                ).get("currentHealthy")
                == 1
            ),
        )
        with pytest.raises(CommandError, match="timed out"):
            testhosts.ansible_playbook(
                fleet3,
                "playbooks/upgrade-driver.yml",
                inventory,
                timeout=60,
                extra_vars={**cluster, "upgrade_failure_budget": 2, "upgrade_drain_timeout": 600},
            )
        v3 = view(cp, node3.name)
        assert v3.state == st.POD_DELETION and v3.unschedulable and v3.cordoned_by_rollout, v3
        assert pod_exists(cp, "train") and _state(node3)["active"] == old
        assert cp.api("DELETE", "/apis/policy/v1/namespaces/default/poddisruptionbudgets/train").ok

        resumed = testhosts.ansible_playbook(
            fleet3,
            "playbooks/upgrade-driver.yml",
            inventory,
            extra_vars={**cluster, "upgrade_failure_budget": 2},
        )
        print("resumed:", resumed.recap)
        assert resumed.returncode == 0, resumed.output[-6000:]
        assert set(resumed.recap) == {"localhost", "node3"}, resumed.recap  # done and failed nodes left out
        assert view(cp, node3.name).state == st.DONE and not view(cp, node3.name).unschedulable
        assert not pod_exists(cp, "train") and pod_exists(cp, "web")  # only the GPU pod was evicted
        assert _state(node3)["active"] == new
        assert view(cp, node1.name).state == st.FAILED and view(cp, node2.name).unschedulable

        again = testhosts.ansible_playbook(
            fleet3,
            "playbooks/upgrade-driver.yml",
            inventory,
            extra_vars={**cluster, "upgrade_failure_budget": 2},
        )
    print("again:", again.recap)
    assert again.returncode == 0, again.output[-6000:]
    assert all(r["changed"] == 0 for r in again.recap.values()), again.recap
    assert json.dumps(again.recap).count('"failed": 0') == len(again.recap)
    for h in (node2, node3):
        assert (h.root / IMAGE_ROOT.lstrip("/") / "opt/nvidia/current").readlink() == Path(new)
