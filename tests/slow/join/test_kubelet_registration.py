"""The real kubelet (v1.24.0-alpha.3) on a test node joins the real control plane with what `nodeprep
join --root` wrote: TLS bootstrap with the bootstrap token, the node-client CSR approved and signed by
the controller-manager, and the Node registered with nodeprep's labels and taints from registration —
in kubeadm mode (the real `kubeadm join phase kubelet-start`, which also waits for the bootstrap to
finish) and in kubelet mode (bootstrap kubeconfig + KubeletConfiguration + the drop-in's flags, no
kubeadm). The node is a Debian 12 rootfs in its own network namespace with containerd 1.6 (configured
through nodeprep's drop-in), the CNI bridge plugin and a locally built pause image
(tests/support/kubelethost.py).

Version: the profile says Kubernetes 1.27 (nodeprep's oldest); the kubelet here is 1.24, which still
needs `--container-runtime=remote --container-runtime-endpoint=...` (the config field nodeprep writes
for 1.27+ does not exist in 1.24). The test adds exactly those two flags when it starts the kubelet,
standing in for the systemd unit; everything else comes from nodeprep's files. GPU facts come from a
recorded nvidia-smi capture (no GPU here).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from nodeprep.cli import main
from tests.support.controlplane import ControlPlane
from tests.support.kubelethost import KubeletHost, kubelet_host
from tests.unit.join.conftest import install_driver, write_token

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
CAPTURES = REPO / "tests/fixtures/nvidia-smi"
SMI = CAPTURES / "tesla-t4_515.105.01.xml"
RUNTIME_FLAGS = ("--container-runtime=remote",
                 "--container-runtime-endpoint=unix:///run/containerd/containerd.sock")
READY_TIMEOUT = 90
DRIVER = "515.105.01"  # the T4 capture's driver: the self-test compares it with the loaded module


@pytest.fixture(scope="module")
def node(control_plane: ControlPlane, test_cache: Path,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeletHost]:
    work = tmp_path_factory.mktemp("kubelet-node")
    with kubelet_host(test_cache, work, control_plane.bins["kubelet"], control_plane.port) as host:
        install_driver(host.root, work / "driver", version=DRIVER)
        yield host


def write_profile(host: KubeletHost, cp: ControlPlane, name: str, **cluster: Any) -> Path:
    data = {
        "driver": {"version": DRIVER},
        "labels": {"extra": {"example.com/team": "ml"}, "cloud": "none"},
        "cluster": {
            "api_server": f"127.0.0.1:{cp.port}",
            "ca_cert_hashes": [cp.pki.ca_pin()],
            "kubernetes_version": "1.27",
            "node_name": name,
            "cgroup_driver": "cgroupfs",
            "gpu_taint": True,
            "taints": ["dedicated=gpu:NoSchedule"],
            **cluster,
        },
    }
    path = host.root.parent / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def nodeprep_join(host: KubeletHost, prof: Path) -> dict[str, Any]:
    r = CliRunner().invoke(main, ["join", "--profile", str(prof), "--root", str(host.root),
                                  "--skip-preflight", "--nvidia-smi-xml", str(SMI), "--json"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    if "containerd" not in host.procs:  # first join: containerd now has nodeprep's drop-in
        host.start_containerd()
        host.import_image(next((host.root / "tmp").glob("pause-*.oci.tar")))
    return json.loads(r.stdout)


def reset_node(host: KubeletHost) -> None:
    host.stop("kubelet")
    host.stop("kubeadm")
    for d in ("etc/kubernetes", "var/lib/kubelet", "etc/systemd/system/kubelet.service.d"):
        shutil.rmtree(host.root / d, ignore_errors=True)


def drop_in_argv(text: str) -> list[str]:
    """The kubelet command line of nodeprep's systemd drop-in (systemd's quoting undone)."""
    exec_line = text.split("ExecStart=\n", 1)[1].split("ExecStart=", 1)[1]
    words = shlex.split(exec_line.replace("\\\n", " "))
    return [w.replace("%%", "%").replace("$$", "$") for w in words]


def wait_registered(cp: ControlPlane, host: KubeletHost, name: str) -> dict[str, Any]:
    def get() -> dict[str, Any] | None:
        if host.procs["kubelet"].poll() is not None:
            raise AssertionError("kubelet exited\n" + host.log_tail("kubelet"))
        r = cp.api("GET", f"/api/v1/nodes/{name}")
        return r.json() if r.status_code == 200 else None

    try:
        return cp.wait(f"Node {name} to register", get, timeout=120)  # type: ignore[no-any-return]
    except AssertionError as e:
        raise AssertionError(f"{e}\n--- kubelet ---\n{host.log_tail('kubelet')}") from None


def ready_or_reason(cp: ControlPlane, host: KubeletHost, name: str) -> tuple[bool, str]:
    """(Ready, the Ready condition's message) after up to READY_TIMEOUT seconds."""
    def ready() -> bool:
        conds = cp.api("GET", f"/api/v1/nodes/{name}").json().get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    try:
        cp.wait(f"Node {name} to be Ready", ready, timeout=READY_TIMEOUT, interval=2)
        return True, "Ready"
    except AssertionError:
        conds = cp.api("GET", f"/api/v1/nodes/{name}").json().get("status", {}).get("conditions", [])
        why = next((c.get("message", "") for c in conds if c["type"] == "Ready"), "no Ready condition")
        return False, why


def check_registration(cp: ControlPlane, node: dict[str, Any], out: dict[str, Any], name: str,
                       token: str) -> None:
    labels = node["metadata"]["labels"]
    assert {k: labels.get(k) for k in out["labels"]} == out["labels"]  # every registration label landed
    assert labels["kubernetes.io/hostname"] == name
    taints = {(t["key"], t.get("value"), t["effect"]) for t in node["spec"].get("taints", [])}
    want = {(t.split("=")[0].split(":")[0], (t.split("=", 1)[1].split(":")[0] if "=" in t else None),
             t.rsplit(":", 1)[1]) for t in out["taints"]}
    assert want <= taints, (want, taints)
    csrs = cp.api("GET", "/apis/certificates.k8s.io/v1/certificatesigningrequests").json()["items"]
    mine = [c for c in csrs if c["spec"]["username"] == f"system:bootstrap:{token[:6]}"]
    assert len(mine) == 1, "one CSR from this node's bootstrap token"
    assert [cond["type"] for cond in mine[0]["status"]["conditions"]] == ["Approved"]
    assert mine[0]["spec"]["signerName"] == "kubernetes.io/kube-apiserver-client-kubelet"
    assert mine[0]["status"].get("certificate"), "approved but not signed"


def test_kubeadm_mode_registers_with_labels_and_taints(control_plane: ControlPlane,
                                                       node: KubeletHost) -> None:
    cp, name = control_plane, "np-kubeadm-node"
    reset_node(node)
    token = cp.create_token()
    write_token(node.root, token=token)
    out = nodeprep_join(node, write_profile(node, cp, name))
    kubeadm_log = node.logs / "kubeadm.log"
    with kubeadm_log.open("ab") as f:
        node.procs["kubeadm"] = subprocess.Popen(
            [str(cp.bins["kubeadm"]), "join", "phase", "kubelet-start", "--config",
             "/etc/nodeprep/kubeadm-join.yaml", "--rootfs", str(node.root)],
            stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    flags_env = node.root / "var/lib/kubelet/kubeadm-flags.env"
    cp.wait("kubeadm to write the kubelet's flags", lambda: flags_env.is_file() and flags_env.stat().st_size,
            timeout=90)
    m = re.search(r'KUBELET_KUBEADM_ARGS="(.*)"', flags_env.read_text())
    assert m
    # kubeadm's own systemd drop-in (10-kubeadm.conf) runs the kubelet with these plus the flags file
    node.spawn("kubelet", "/usr/bin/kubelet",
               "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
               "--kubeconfig=/etc/kubernetes/kubelet.conf", "--config=/var/lib/kubelet/config.yaml",
               *shlex.split(m.group(1)))
    registered = wait_registered(cp, node, name)
    check_registration(cp, registered, out, name, token)
    node.procs["kubeadm"].wait(120)
    assert node.procs["kubeadm"].returncode == 0, kubeadm_log.read_text()
    assert "This node has joined the cluster" in kubeadm_log.read_text() or \
        "TLS Bootstrap" in kubeadm_log.read_text()
    ready, why = ready_or_reason(cp, node, name)
    print(f"kubeadm mode: Ready={ready}: {why}")


def test_kubelet_mode_registers_with_labels_and_taints(control_plane: ControlPlane,
                                                       node: KubeletHost) -> None:
    cp, name = control_plane, "np-kubelet-node"
    reset_node(node)
    (node.root / "etc/kubernetes/pki").mkdir(parents=True, exist_ok=True)
    shutil.copy(cp.pki.ca_cert, node.root / "etc/kubernetes/pki/ca.crt")
    token = cp.create_token()
    write_token(node.root, token=token)
    out = nodeprep_join(node, write_profile(node, cp, name, mode="kubelet"))
    argv = drop_in_argv((node.root / "etc/systemd/system/kubelet.service.d/10-nodeprep.conf").read_text())
    assert argv[0] == "/usr/bin/kubelet"
    node.spawn("kubelet", *argv, *RUNTIME_FLAGS)
    registered = wait_registered(cp, node, name)
    check_registration(cp, registered, out, name, token)
    assert (node.root / "etc/kubernetes/kubelet.conf").is_file()
    ready, why = ready_or_reason(cp, node, name)
    print(f"kubelet mode: Ready={ready}: {why}")
    check_gpu_verification(cp, node, name)


def rooted_kubeconfig(host: KubeletHost) -> Path:
    """The kubelet's own kubeconfig (written by its TLS bootstrap) with its file paths under the node
    root, so the test process can use the node's credential."""
    doc = yaml.safe_load((host.root / "etc/kubernetes/kubelet.conf").read_text())
    for section, keys in (("clusters", ("certificate-authority",)),
                          ("users", ("client-certificate", "client-key"))):
        for item in doc[section]:
            body = item["cluster" if section == "clusters" else "user"]
            for k in keys:
                if isinstance(body.get(k), str) and body[k].startswith("/"):
                    p = Path(str(host.root) + body[k])
                    while p.is_symlink() and os.readlink(p).startswith("/"):  # kubelet-client-current.pem
                        p = Path(str(host.root) + os.readlink(p))
                    body[k] = str(p)
    path = host.root.parent / "kubelet-rooted.conf"
    path.write_text(yaml.safe_dump(doc))
    return path


def check_gpu_verification(cp: ControlPlane, host: KubeletHost, name: str) -> None:
    """With the kubelet's own certificate, the self-test's verdict is published (the boot id is the one
    the real kubelet reported); the controller then lifts the taint from this node only."""
    sysfs = host.root.parent / "fake-sys"
    (sysfs / "module/nvidia").mkdir(parents=True, exist_ok=True)
    (sysfs / "module/nvidia/version").write_text(DRIVER + "\n")
    d = sysfs / "bus/pci/devices/0000:00:1e.0"  # the T4 capture's GPU
    d.mkdir(parents=True, exist_ok=True)
    (d / "vendor").write_text("0x10de\n")
    (d / "class").write_text("0x030200\n")
    r = CliRunner().invoke(main, ["verify-gpus", "--root", str(host.root), "--sysfs-root", str(sysfs),
                                  "--nvidia-smi-xml", str(SMI), "--apply", "--node", name,
                                  "--kubeconfig", str(rooted_kubeconfig(host))], catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    docs = yaml.safe_load_all((REPO / "examples/verify-nodes-rbac.yaml").read_text())
    conf = cp.user_kubeconfig("nodeprep-verify-nodes", next(x for x in docs if x["kind"] == "ClusterRole"))
    r = CliRunner().invoke(main, ["verify-nodes", "--kubeconfig", str(conf), "--once"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    assert f"node {name}: GPU self-test passed for this boot and driver: taint removed" in r.stdout
    taints = {t["key"] for t in cp.api("GET", f"/api/v1/nodes/{name}").json()["spec"]["taints"]}
    assert "nodeprep.dev/unverified" not in taints and {"dedicated", "nvidia.com/gpu"} <= taints
    other = cp.api("GET", "/api/v1/nodes/np-kubeadm-node")  # registered by the kubeadm-mode test
    if other.status_code == 200:  # no verdict there: still tainted
        assert "nodeprep.dev/unverified" in {t["key"] for t in other.json()["spec"]["taints"]}
