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
- one look (`nodeprep health --apply`, `--check`) on the mock's `example-h100-faults`;
- every fault class in turn on one node, each arriving and leaving;
- a silent reporter: its heartbeat older than `verify-nodes --health-stale` taints the node;
- retired pages pending on a T4 (the mock, with a C stand-in for its two pre-Ampere answers).
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


GPU = "GPU-01000100-0000-0000-0000-00000000000{}"
# (fault, the overrides that bring it, the reason, what the message holds, the overrides that clear it)
FAULTS: list[tuple[str, dict[str, Any], str, list[str], dict[str, Any]]] = [
    ("uncorrectable ECC with Xid 48", {"1": {"failure": {"mode": "ecc_uncorrectable", "xid": {"code": 48}}}},
     "RowRemapFailure",  # the mock also marks a row remapping failure with it: the worst finding wins
     [f"GPU 1 ({GPU.format(1)}, 00000000:1B:00.0): ",
      "Xid 48 Double Bit ECC Error (ROBUST_CHANNEL_GPU_ECC_DBE, from nvml): reset",
      "uncorrected ECC errors since the last reset: reset", "row remapping failed (RMA policy): replace"],
     {"1": {"failure": {"mode": "healthy"}}}),
    ("a lost GPU", {"2": {"failure": {"mode": "lost"}}}, "GPULost",
     [f"GPU 2 ({GPU.format(2)}, 00000000:4A:00.0): NVML cannot reach the GPU (GPU is lost): reboot"],
     {"2": {"failure": {"mode": "healthy"}}}),
    ("fallen off the bus (Xid 79)", {"0": {"failure": {"mode": "fallen_off_bus", "xid": {"code": 79}}}},
     "GPULost", [f"GPU 0 ({GPU.format(0)}, 00000000:1A:00.0): NVML cannot reach the GPU",
                 "Xid 79 GPU has fallen off the bus (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS, from nvml): "
                 "reboot"],
     {"0": {"failure": {"mode": "healthy"}}}),
    ("a pending row remap", {"5": {"remapped_rows": {"pending": True}}}, "RowRemapPending",
     [f"GPU 5 ({GPU.format(5)}, 00000000:8B:00.0): remapped rows pending a GPU reset: reset"],
     {"5": {"remapped_rows": {"pending": False}}}),
    ("a row remapping failure", {"4": {"remapped_rows": {"failure_occurred": True}}}, "RowRemapFailure",
     [f"GPU 4 ({GPU.format(4)}, 00000000:8A:00.0): row remapping failed (RMA policy): replace"],
     {"4": {"remapped_rows": {"failure_occurred": False}}}),
    ("NVLink error counters rising", {"3": {"nvlink_error": {"rate": 100}}}, "NVLinkErrors",
     [f"GPU 3 ({GPU.format(3)}, 00000000:4B:00.0): NVLink error counters rising (crc_data "],
     {"3": {"nvlink_error": {"rate": 0}}}),
    ("fabric not COMPLETED", {"6": {"fabric": {"state": "in_progress"}}}, "FabricNotReady",
     [f"GPU 6 ({GPU.format(6)}, 00000000:CA:00.0): fabric state IN_PROGRESS, not COMPLETED: reset"],
     {"6": {"fabric": {"state": "completed"}}}),
]
STALE = 10  # verify-nodes --health-stale; the services here heartbeat every 2 s


def _write_overrides(path: Path, devices: dict[str, Any]) -> None:
    tmp = path.with_suffix(".new")
    tmp.write_text(yaml.safe_dump({"devices": devices}))
    tmp.replace(path)


def _kmsg_record(seq: int, message: str) -> str:
    """A /dev/kmsg record of `message` stamped now (CLOCK_MONOTONIC, as the kernel stamps them)."""
    return f"3,{seq},{int(time.monotonic() * 1e6)},-;{message}\n"


def _recorded_line(code: int) -> str:
    """The recorded NVRM line of Xid `code` (tests/fixtures/kmsg/nvrm-xid.dmesg), its dmesg stamp cut."""
    for line in (REPO / "tests/fixtures/kmsg/nvrm-xid.dmesg").read_text().splitlines():
        if f"): {code}, " in line:
            return line.split("] ", 1)[1]
    raise AssertionError(code)


def test_every_fault_class_arrives_and_leaves(control_plane: ControlPlane, test_cache: Path, tmp_path: Path,
                                              spawn: Any) -> None:
    """Each fault class, one after another on one node, through one running service: the condition
    (status, reason, the GPU by index/UUID/PCI address, each finding with its action), the taint by
    verify-nodes, and recovery after the hold once the fault clears. GPUs: NVIDIA's NVML mock, H100
    profile with GPU 7 moved to PCI 0000:65:00.0 (tests/fixtures/mocknvml/h100-gsp-at-65.yaml), faults
    brought and taken away through its runtime overrides file; the kmsg-only Xid 119 is the recorded
    NVRM line of tests/fixtures/kmsg/nvrm-xid.dmesg, fed as a /dev/kmsg record stamped now. NVLink
    down comes from a derived profile (the mock's overrides cannot change links), by one look each way.
    Retired pages pending on a pre-Ampere GPU is test_retired_pages_pending_on_a_pre_ampere_gpu (the
    mock's T4 needs a stand-in for two answers)."""
    cp, name = control_plane, "np-faults"
    register(cp, name)
    overrides, kmsg = tmp_path / "overrides.yaml", tmp_path / "kmsg"
    healed: dict[str, Any] = {}
    _write_overrides(overrides, healed)
    kmsg.write_text("")
    env = mocknvml.env(test_cache, mocknvml.derived("h100-gsp-at-65", tmp_path / "profiles"))
    env["MOCK_NVML_OVERRIDES"] = str(overrides)
    spawn(["health", "--watch", "--apply", "--kubeconfig", str(cp.node_credential(name)), "--node", name,
           "--hold", str(HOLD), "--xid-window", "4", "--interval", "1", "--heartbeat", "2",
           "--kmsg", str(kmsg)], env, "health.log")
    controller = spawn(["verify-nodes", "--kubeconfig", str(controller_credential(cp)), "--interval", "1",
                        "--health-stale", str(STALE)], {"PATH": env["PATH"]}, "verify-nodes.log")
    wait_status(cp, name, "True", "GPUHealthy=True at the start")
    seen: list[str] = []

    def arrives_and_leaves(what: str, bring: Any, reason: str, parts: list[str], clear: Any) -> None:
        bring()
        def arrived() -> dict[str, Any] | None:
            c = condition(cp, name)
            return c if c and c["status"] == "False" and c["reason"] == reason and all(
                p in c["message"] for p in parts) else None

        try:
            down = cp.wait(f"{what}: GPUHealthy=False {reason}", arrived, timeout=45, interval=0.2)
        except AssertionError:
            raise AssertionError(f"{what}: the condition is {condition(cp, name)}") from None
        cp.wait(f"{what}: the taint", lambda: tainted(cp, name), timeout=30)
        t0 = time.monotonic()
        clear()
        up = wait_status(cp, name, "True", f"{what}: True again", timeout=60)
        assert time.monotonic() - t0 >= HOLD - 0.5 and up["reason"] == "GPUsHealthy", up
        cp.wait(f"{what}: the taint lifted", lambda: not tainted(cp, name), timeout=30)
        seen.append(f"{what}: {down['reason']}: {down['message']}")

    for what, fault, reason, parts, clear in FAULTS:
        arrives_and_leaves(what, lambda f=fault: _write_overrides(overrides, {**healed, **f}), reason, parts,
                           lambda c=clear: (healed.update(c), _write_overrides(overrides, healed)))

    line = _recorded_line(119)
    assert line.startswith("NVRM: Xid (PCI:0000:65:00): 119, ")
    arrives_and_leaves("a kmsg-only Xid 119 (GSP)", lambda: kmsg.open("a").write(_kmsg_record(1, line)),
                       "XID119", [f"GPU 7 ({GPU.format(7)}, 00000000:65:00.0): Xid 119 GSP RPC Timeout "
                                  "(GSP_RPC_TIMEOUT, from kmsg): pid='N/A', Timeout waiting for RPC from "
                                  "GSP: reset"], lambda: None)

    # NVLink down: one look with the node's credential on a profile with GPU 3's link 0 inactive
    other = "np-nvlink"
    register(cp, other)
    look = [sys.executable, "-m", "nodeprep.cli", "health", "--no-kmsg", "--apply", "--kubeconfig",
            str(cp.node_credential(other)), "--node", other]
    down_env = mocknvml.env(test_cache, mocknvml.derived("h100-nvlink-down", tmp_path / "profiles"))
    r = subprocess.run(look, cwd=REPO, env=down_env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    c = condition(cp, other)
    assert c is not None and c["status"] == "False" and c["reason"] == "NVLinkDown"
    assert f"GPU 3 ({GPU.format(3)}, 00000000:4B:00.0): NVLink links 0 inactive, 16 of 17 active: reset" \
        in c["message"]
    cp.wait("NVLink down: the taint", lambda: tainted(cp, other), timeout=30)
    seen.append(f"NVLink down: {c['reason']}: {c['message']}")
    r = subprocess.run(look, cwd=REPO, env=mocknvml.env(test_cache, "h100"), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert (condition(cp, other) or {}).get("status") == "True"
    cp.wait("NVLink down: the taint lifted", lambda: not tainted(cp, other), timeout=30)
    assert controller.poll() is None, (tmp_path / "verify-nodes.log").read_text()
    print("\n".join(seen))
    print((tmp_path / "verify-nodes.log").read_text())


def test_a_silent_health_reporter_taints_its_node(control_plane: ControlPlane, test_cache: Path,
                                                   tmp_path: Path, spawn: Any) -> None:
    """The service stops (its condition still says True): once the heartbeat is older than
    --health-stale, verify-nodes counts it as Unknown and taints the node saying the reporter is
    silent; the service back, a fresh heartbeat lifts the taint. GPUs: NVIDIA's NVML mock (H100)."""
    cp, name = control_plane, "np-silent"
    register(cp, name)
    env = mocknvml.env(test_cache, "h100")
    args = ["health", "--watch", "--apply", "--kubeconfig", str(cp.node_credential(name)), "--node", name,
            "--hold", str(HOLD), "--interval", "1", "--heartbeat", "2", "--no-kmsg"]
    service = spawn(args, env, "health.log")
    spawn(["verify-nodes", "--kubeconfig", str(controller_credential(cp)), "--interval", "1",
           "--health-stale", str(STALE)], {"PATH": env["PATH"]}, "verify-nodes.log")
    first = wait_status(cp, name, "True", "GPUHealthy=True")
    cp.wait("a second heartbeat", lambda: (condition(cp, name) or {}).get("lastHeartbeatTime")
            != first["lastHeartbeatTime"], timeout=15)
    assert not tainted(cp, name)
    procs.terminate_group(service)
    procs.wait_or_kill_group(service, 10)
    t0 = time.monotonic()
    cp.wait("the silent reporter's taint", lambda: tainted(cp, name), timeout=STALE + 30)
    assert time.monotonic() - t0 >= STALE - 3
    assert (condition(cp, name) or {}).get("status") == "True"  # the condition itself did not change
    log = tmp_path / "verify-nodes.log"
    cp.wait("the reason in verify-nodes' output", lambda: "the health reporter is silent" in log.read_text(),
            timeout=10)
    assert f"node {name}: GPUHealthy counts as Unknown: its heartbeat is " in log.read_text()
    spawn(args, env, "health-again.log")
    cp.wait("the taint lifted by a fresh heartbeat", lambda: not tainted(cp, name), timeout=30)
    lifted = (f"node {name}: GPUHealthy=True with a fresh heartbeat: nodeprep.dev/gpu-unhealthy:NoSchedule "
              "removed")
    cp.wait("the lift in verify-nodes' output", lambda: lifted in log.read_text(), timeout=10)
    print(log.read_text())


def test_mig_devices_follow_their_failed_parent(control_plane: ControlPlane, test_cache: Path,
                                                tmp_path: Path) -> None:
    """MIG devices of a failed GPU are named with it in the condition and `--json`. Data: the mock
    (H100, MIG mode enabled: tests/fixtures/mocknvml/h100-mig-enabled.yaml; GPU 0 lost through its
    overrides) lists no MIG devices (its README), so their names come from the record `nodeprep mig`
    writes, ROOT/var/lib/nodeprep/mig.json, here as it is after all-1g.10gb (seven 1g.10gb on each GPU)
    was applied: written by nodeprep's own writer (node.migapply.record, layout_of's shape) for the
    mock's GPU UUIDs, since the mock cannot create MIG devices."""
    import json

    from nodeprep.node.migapply import Outcome, record

    cp, name = control_plane, "np-mig"
    register(cp, name)
    root = tmp_path / "root"
    record(root, Outcome("all-1g.10gb", "success", [f"GPU {i}: created 7 MIG device(s)" for i in range(8)],
                         layout=[{"index": i, "uuid": GPU.format(i), "mig_devices": ["1g.10gb"] * 7}
                                 for i in range(8)]))
    overrides = tmp_path / "overrides.yaml"
    _write_overrides(overrides, {"0": {"failure": {"mode": "lost"}}})
    env = mocknvml.env(test_cache, mocknvml.derived("h100-mig-enabled", tmp_path / "profiles"))
    env["MOCK_NVML_OVERRIDES"] = str(overrides)
    r = subprocess.run([sys.executable, "-m", "nodeprep.cli", "health", "--json", "--no-kmsg", "--root",
                        str(root), "--apply", "--kubeconfig", str(cp.node_credential(name)), "--node", name],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    gpu0 = json.loads(r.stdout)["gpus"][0]
    assert gpu0["healthy"] is False and [m["name"] for m in gpu0["mig_devices"]] == [
        f"MIG 1g.10gb Device {i}" for i in range(7)]
    assert all(m["healthy"] is False and m["parent"] == GPU.format(0) for m in gpu0["mig_devices"])
    c = condition(cp, name)
    assert c is not None and c["status"] == "False" and c["reason"] == "GPULost"
    children = ", ".join(f"MIG 1g.10gb Device {i}" for i in range(7))
    assert c["message"].startswith(f"GPU 0 ({GPU.format(0)}, 00000000:1A:00.0) (with its MIG devices "
                                   f"{children}): NVML cannot reach the GPU"), c["message"]
    done = subprocess.run([sys.executable, "-m", "nodeprep.cli", "verify-nodes", "--once", "--kubeconfig",
                           str(controller_credential(cp))], cwd=REPO, env={"PATH": env["PATH"]},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "GPUHealthy=False (GPULost): nodeprep.dev/gpu-unhealthy:NoSchedule added" in done.stdout
    assert tainted(cp, name)
    print(c["message"])


def _retired_pages_nvml(folder: Path) -> Path:
    """A folder whose `libnvidia-ml.so.1` is the C stand-in tests/fixtures/mocknvml/t4-retired-pages.c
    (row remapping NOT_SUPPORTED as on a real T4, retired pages pending for the GPU indexes listed in
    $NVML_RETIRED_PENDING_FILE), needing the mock's library for every other NVML function."""
    folder.mkdir(parents=True)
    real = Path(mocknvml.LIBRARY).name  # libnvidia-ml.so.550.163.01: the name the stand-in needs
    (folder / "stub.c").write_text("int nvmlDeviceGetIndex(void *d, unsigned *i) { return 999; }\n")
    stub_dir = folder / "stub"
    stub_dir.mkdir()
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(stub_dir / real), f"-Wl,-soname,{real}",
                    str(folder / "stub.c")], check=True)  # only to link against: the loader finds the mock
    source = REPO / "tests/fixtures/mocknvml/t4-retired-pages.c"
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wall", "-Werror", "-o", str(folder / "libnvidia-ml.so.1"),
                    "-Wl,-soname,libnvidia-ml-retired.so", str(source), "-Wl,--no-as-needed",
                    str(stub_dir / real)], check=True)
    (folder / real).symlink_to(mocknvml.root() / mocknvml.LIBRARY)
    return folder


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the retired-pages stand-in")
def test_retired_pages_pending_on_a_pre_ampere_gpu(control_plane: ControlPlane, test_cache: Path,
                                                    tmp_path: Path, spawn: Any) -> None:
    """Retired pages pending (pre-Ampere: Turing retires pages, it has no row remapping) arrive as the
    condition and the taint, and leave after the hold. GPUs: NVIDIA's NVML mock as a T4 machine, with the
    two NVML answers it gets wrong for a T4 given by the C stand-in tests/fixtures/mocknvml/
    t4-retired-pages.c (row remapping NOT_SUPPORTED; retired pages pending for the GPUs listed in a file);
    everything else the running service reads is the mock's."""
    cp, name = control_plane, "np-retired"
    register(cp, name)
    pending = tmp_path / "pending"
    pending.write_text("")
    env = mocknvml.env(test_cache, "t4")
    env["LD_LIBRARY_PATH"] = str(_retired_pages_nvml(tmp_path / "nvml"))
    env["NVML_RETIRED_PENDING_FILE"] = str(pending)
    spawn(["health", "--watch", "--apply", "--kubeconfig", str(cp.node_credential(name)), "--node", name,
           "--hold", str(HOLD), "--interval", "1", "--no-kmsg"], env, "health.log")
    controller = spawn(["verify-nodes", "--kubeconfig", str(controller_credential(cp)), "--interval", "1"],
                       {"PATH": env["PATH"]}, "verify-nodes.log")
    wait_status(cp, name, "True", "GPUHealthy=True at the start")
    pending.write_text("2\n")

    def arrived() -> dict[str, Any] | None:
        c = condition(cp, name)
        return c if c and c["status"] == "False" and c["reason"] == "RetiredPagesPending" else None

    down = cp.wait("GPUHealthy=False RetiredPagesPending", arrived, timeout=45, interval=0.2)
    assert down["message"] == ("GPU 2 (GPU-00000074-0000-0000-0000-000000000002, 00000000:AF:00.0): "
                               "retired pages pending a reset: reset"), down["message"]
    cp.wait("the taint", lambda: tainted(cp, name), timeout=30)
    t0 = time.monotonic()
    pending.write_text("")
    up = wait_status(cp, name, "True", "True again", timeout=60)
    assert time.monotonic() - t0 >= HOLD - 0.5 and up["reason"] == "GPUsHealthy", up
    cp.wait("the taint lifted", lambda: not tainted(cp, name), timeout=30)
    assert controller.poll() is None, (tmp_path / "verify-nodes.log").read_text()
    print(f"{down['reason']}: {down['message']}")
