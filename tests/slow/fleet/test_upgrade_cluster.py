"""playbooks/upgrade-driver.yml against three SSH test hosts and a real kube-apiserver (v1.24.0-alpha.3,
tests/support/controlplane.py), the cluster steps run on the controller with the credential of
examples/upgrade-rbac.yaml.

No kubelet runs here: the Nodes node1..node3 are API objects registered as nodeprep's kubelet config
registers a GPU node (tainted nodeprep.dev/unverified:NoSchedule, status.nodeInfo.bootID this kernel's
boot id), the pods objects bound to node3 with spec.nodeName, Running and Ready set through the status
subresource, terminationGracePeriodSeconds 0 (the API server deletes an evicted pod at once). The driver
goes into an image root on each host (no module for the CI kernel can load: the reload step decides for
an image and loads nothing; the doctor gate runs its state and ldcache checks).

Validation is the GPU self-test (upgrade_gpu_selftest, the default), run on each host against NVIDIA's
NVML mock (tests/support/mocknvml.py): the host's nvidia-ml-py (the controller's pynvml.py, as a node
has it installed) loads the mock as libnvidia-ml.so.1 answering as the 8-GPU HGX H100 with the new
driver's version (an interpreter wrapper sets LD_LIBRARY_PATH and MOCK_NVML_CONFIG for the modules).
Stand-ins, each at one boundary: the image root's sys/ holds what the kernel would show once the new
module is loaded (module/nvidia/version the new version, reference count 0, the H100's eight PCI
functions; no nvidia.ko can load here) and its proc/ the boot id; NFD is played by a thread that copies
the labels node_labels wrote to the host's NFD features file onto its Node; the real
`nodeprep verify-nodes` pass (examples/verify-nodes-rbac.yaml's credential) runs every second beside the
rollout; the node's own credential (system:node:NAME) reaches the loopback API server through a TCP relay
in its namespace (tests/support/relay.py).

One rollout, batch 1, failure budget 1: node2 was cordoned by someone else (it goes first: it costs no
capacity), passes its self-test (verdict published, taint lifted by verify-nodes) and stays cordoned;
node1's store serves a corrupted artifact: its install fails, nothing switched, it is labelled
upgrade-failed with the reason and left cordoned, and the rollout pauses at the budget; node3 never
started. The re-run with budget 2 resumes: node1 stays failed, node2 stays done, node3 is upgraded with
only its GPU pod evicted. Before that re-run, a run is interrupted (killed after 60 s while a
PodDisruptionBudget blocks node3's eviction): node3 stays in pod-deletion-required, cordoned by the
rollout, on its old driver, and the re-run resumes it there. A third run changes nothing (changed=0).
Last, node1 is retried (its label removed, its store fixed) on a mock whose GPU 2 is lost
(tests/fixtures/mocknvml/h100-gpu-lost.yaml): its self-test fails, the new version is rolled back, the
node is labelled upgrade-failed with the self-test's reason and left cordoned and tainted, and the
rollout pauses at the budget of 1. That last run reads the rollout's variables (upgrade_kubeconfig among
them) from the inventory, not -e: the playbook's own defaults must not outrank them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from nodeprep.errors import CommandError
from nodeprep.upgrade import states as st
from tests.slow.join.test_gpu_verification import controller_credential
from tests.slow.upgrade.test_rollout_apiserver import (
    make_node,
    make_pod,
    node,
    pod_exists,
    rollout_credential,
    view,
)
from tests.support import mocknvml, testhosts
from tests.support.controlplane import ControlPlane
from tests.support.relay import apiserver_in

from .conftest import IMAGE_ROOT, Store, fleet_vars, write_inventory
from .test_upgrade import _corrupt_copy, _state

pytestmark = pytest.mark.slow

MERGE = "application/merge-patch+json"
UNVERIFIED = {"key": "nodeprep.dev/unverified", "effect": "NoSchedule"}
MOCK_DIR = "usr/local/lib/mocknvml"  # on each host: the mock's library and the profile it answers as
NFD_FILE = "etc/kubernetes/node-feature-discovery/features.d/nodeprep"


def mock_profile(source: Path, version: str, dest: Path) -> Path:
    """`source` (a profile of NVIDIA's NVML mock) reporting driver `version` (the one the host's sysfs
    stand-in says is loaded), written to `dest`."""
    data = yaml.safe_load(source.read_text())
    data["system"]["driver_version"] = version
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest


def give_mock_nvml(host: testhosts.TestHost, profile: Path) -> str:
    """The host's NVML is the mock answering as `profile`, its nvidia-ml-py the controller's; returns the
    interpreter (a wrapper setting LD_LIBRARY_PATH and MOCK_NVML_CONFIG) for ansible_python_interpreter."""
    import pynvml

    lib = host.root / MOCK_DIR
    lib.mkdir(parents=True, exist_ok=True)
    shutil.copy(mocknvml.root() / mocknvml.LIBRARY, lib / "libnvidia-ml.so.1")
    shutil.copy(profile, lib / "profile.yaml")
    shutil.copy(pynvml.__file__, host.root / "usr/lib/python3/dist-packages/pynvml.py")
    wrapper = host.root / "usr/local/bin/python3-mocknvml"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"export LD_LIBRARY_PATH=/{MOCK_DIR} MOCK_NVML_CONFIG=/{MOCK_DIR}/profile.yaml\n"
        'exec /usr/bin/python3 "$@"\n'
    )
    wrapper.chmod(0o755)
    return "/usr/local/bin/python3-mocknvml"


def gpu_kernel_standin(host: testhosts.TestHost, version: str, profile: Path, boot: str) -> None:
    """The image root's sys/ as the kernel shows it once nvidia `version` is loaded (reference count 0,
    the profile's GPUs on the PCI bus) and its proc/ boot id."""
    image = host.root / IMAGE_ROOT.lstrip("/")
    mod = image / "sys/module/nvidia"
    mod.mkdir(parents=True, exist_ok=True)
    (mod / "version").write_text(version + "\n")
    (mod / "refcnt").write_text("0\n")
    (mod / "holders").mkdir(exist_ok=True)
    for dev in yaml.safe_load(profile.read_text())["devices"]:
        d = image / "sys/bus/pci/devices" / dev["pci"]["bus_id"].lower()
        d.mkdir(parents=True, exist_ok=True)
        (d / "vendor").write_text("0x10de\n")
        (d / "class").write_text("0x030200\n")
    (image / "proc/sys/kernel/random").mkdir(parents=True, exist_ok=True)
    (image / "proc/sys/kernel/random/boot_id").write_text(boot + "\n")


def register_gpu_node(cp: ControlPlane, name: str, boot: str, *, unschedulable: bool) -> None:
    """The Node as nodeprep's kubelet config registers it: tainted unverified, its boot id reported."""
    make_node(cp, name, unschedulable=unschedulable)
    r = cp.api("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": [UNVERIFIED]}}, content_type=MERGE)
    assert r.status_code == 200, r.text
    r = cp.api(
        "PATCH",
        f"/api/v1/nodes/{name}/status",
        {"status": {"nodeInfo": {"bootID": boot}}},
        content_type=MERGE,
    )
    assert r.status_code == 200, r.text


@contextlib.contextmanager
def cluster_side(cp: ControlPlane, hosts: tuple[testhosts.TestHost, ...]) -> Iterator[list[str]]:
    """Every second: NFD's part (the labels in each host's features file copied onto its Node) and one
    real verify-nodes pass; yields the lines verify-nodes printed."""
    from nodeprep.join.verification import verify_nodes
    from nodeprep.kubeapi import load_kubeconfig

    cfg = load_kubeconfig(controller_credential(cp))
    stop, lines = threading.Event(), []

    def loop() -> None:
        while not stop.wait(1.0):
            for h in hosts:
                f = h.root / IMAGE_ROOT.lstrip("/") / NFD_FILE
                if not f.is_file():
                    continue
                want = dict(
                    line.split("=", 1)
                    for line in f.read_text().splitlines()
                    if "=" in line and line[0] != "#"
                )
                have = node(cp, h.name)["metadata"].get("labels") or {}
                if any(have.get(k) != v for k, v in want.items()):
                    cp.api(
                        "PATCH", f"/api/v1/nodes/{h.name}", {"metadata": {"labels": want}}, content_type=MERGE
                    )
            with contextlib.suppress(Exception):  # the API server busy: next pass
                lines.extend(verify_nodes(cfg))

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield lines
    finally:
        stop.set()
        t.join(30)


def tainted(cp: ControlPlane, name: str) -> bool:
    return any(t.get("key") == UNVERIFIED["key"] for t in node(cp, name)["spec"].get("taints") or [])


def test_rollout_with_a_cluster(
    fleet3: testhosts.Fleet,
    upgrade_store: Store,
    source_snapshot: Path,
    tmp_path: Path,
    control_plane: ControlPlane,
) -> None:
    if reason := mocknvml.skip_reason():
        pytest.skip(reason)
    cp = control_plane
    old, new = upgrade_store.versions
    served = tmp_path / "served"
    served.mkdir()
    (served / "good").symlink_to(upgrade_store.path)
    _corrupt_copy(upgrade_store.path, served / "bad", f"nvidia-userspace-{new}-amd64.tar.zst")
    node1, node2, node3 = fleet3.hosts
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()  # the hosts' kernel is this one
    healthy = mock_profile(mocknvml.config("h100"), new, tmp_path / "profiles/h100.yaml")
    lost = mock_profile(
        mocknvml.derived("h100-gpu-lost", tmp_path / "derived"), new, tmp_path / "profiles/h100-gpu-lost.yaml"
    )
    conf = rollout_credential(cp)
    python = {h.name: give_mock_nvml(h, healthy) for h in fleet3.hosts}
    for h in fleet3.hosts:
        register_gpu_node(cp, h.name, boot, unschedulable=h is node2)
        kubelet_conf = h.root / "etc/kubernetes/kubelet.conf"
        kubelet_conf.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(cp.node_credential(h.name), kubelet_conf)
        os.chmod(kubelet_conf, 0o600)
    make_pod(cp, node3.name, "train", gpu=True)
    make_pod(cp, node3.name, "web", gpu=False)
    with contextlib.ExitStack() as stack:
        for h in fleet3.hosts:
            stack.enter_context(apiserver_in(h.netns, h.gateway, cp.port))
        urls = stack.enter_context(testhosts.serve_directory(served, fleet3))
        host_vars: dict[str, dict[str, object]] = {
            h.name: {
                "nvidia_driver_store": urls[h.name] + ("/bad" if h is node1 else "/good"),
                "ansible_python_interpreter": python[h.name],
            }
            for h in fleet3.hosts
        }
        group_vars = fleet_vars(tmp_path, source_snapshot, old, kernel=upgrade_store.kernel)
        inventory = write_inventory(fleet3, tmp_path / "inventory.yml", group_vars, host_vars)
        # the fleet's first driver: the fixture, not the rollout under test
        first = testhosts.ansible_playbook(
            fleet3, "playbooks/upgrade-driver.yml", inventory, extra_vars={"upgrade_gpu_selftest": False}
        )
        assert first.returncode == 0, first.output[-6000:]
        for h in fleet3.hosts:
            gpu_kernel_standin(h, new, healthy, boot)
        verified = stack.enter_context(cluster_side(cp, fleet3.hosts))
        cluster = {
            "nvidia_driver_version": new,
            "upgrade_kubeconfig": str(conf),
            "upgrade_drain_timeout": 30,
            "upgrade_validation_timeout": 120,
            "node_labels_nvidia_smi_xml": "",  # the labels from NVML (the mock) too
        }

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
        assert v2.driver == new and not tainted(cp, node2.name), verified  # the self-test's taint lifted
        assert any(line.startswith("node node2:") for line in verified), verified
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

        def budget_2(run: str) -> testhosts.PlaybookRun:
            """The rollout again with failure budget 2, which must succeed."""
            played = testhosts.ansible_playbook(
                fleet3,
                "playbooks/upgrade-driver.yml",
                inventory,
                extra_vars={**cluster, "upgrade_failure_budget": 2},
            )
            print(f"{run}:", played.recap)
            assert played.returncode == 0, played.output[-6000:]
            return played

        resumed = budget_2("resumed")
        assert set(resumed.recap) == {"localhost", "node3"}, resumed.recap  # done and failed nodes left out
        assert view(cp, node3.name).state == st.DONE and not view(cp, node3.name).unschedulable
        assert not tainted(cp, node3.name)
        assert not pod_exists(cp, "train") and pod_exists(cp, "web")  # only the GPU pod was evicted
        assert _state(node3)["active"] == new
        assert view(cp, node1.name).state == st.FAILED and view(cp, node2.name).unschedulable

        again = budget_2("again")
        assert all(r["changed"] == 0 for r in again.recap.values()), again.recap
        assert json.dumps(again.recap).count('"failed": 0') == len(again.recap)

        # node1 retried (label removed, store fixed) on a node whose GPU 2 is lost
        r = cp.api(
            "PATCH",
            f"/api/v1/nodes/{node1.name}",
            {"metadata": {"labels": {st.STATE_LABEL: None}}},
            content_type=MERGE,
        )
        assert r.status_code == 200, r.text
        shutil.copy(lost, node1.root / MOCK_DIR / "profile.yaml")
        host_vars[node1.name]["nvidia_driver_store"] = urls[node1.name] + "/good"
        # the rollout's variables from the inventory this time (the playbook's own defaults rank lower)
        inventory_vars = {**group_vars, **cluster}
        write_inventory(fleet3, inventory, inventory_vars, host_vars)
        failed = testhosts.ansible_playbook(fleet3, "playbooks/upgrade-driver.yml", inventory)
    print("lost GPU:", failed.recap)
    assert failed.returncode != 0, failed.output[-6000:]
    assert "rollout paused: 1 failed node(s) reach the failure budget 1: node1" in failed.output, (
        failed.output[-4000:]
    )
    v1 = view(cp, node1.name)
    print("verify-nodes:", *verified, sep="\n  ")
    print("node1:", v1.state, "reason:", v1.reason)
    print(
        *[ln for ln in failed.output.splitlines() if "GPU self-test failed" in ln or "paused" in ln][:4],
        sep="\n",
    )
    assert v1.state == st.FAILED and v1.unschedulable and v1.cordoned_by_rollout, v1
    assert v1.reason is not None and "GPU self-test failed" in v1.reason, v1.reason
    assert "visibility: GPU 0000:4a:00.0 is lost" in v1.reason, v1.reason
    assert tainted(cp, node1.name)  # verify-nodes keeps a node with a failed verdict tainted
    assert _state(node1)["active"] == old  # rolled back
    for h in (node2, node3):
        assert (h.root / IMAGE_ROOT.lstrip("/") / "opt/nvidia/current").readlink() == Path(new)
