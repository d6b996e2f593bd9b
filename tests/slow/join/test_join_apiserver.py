"""`nodeprep join` (kubeadm mode) against a real control plane (Kubernetes v1.24.0-alpha.3 on loopback,
tests/support/controlplane.py): the right CA pin and token pass nodeprep's discovery check and the real
`kubeadm join phase kubelet-start` reads nodeprep's JoinConfiguration (v1beta3), discovers the cluster
and writes the bootstrap kubeconfig; a wrong pin, a wrong, deleted or expired token and an unreachable
API server are refused with one line and nothing written under --root.

Version: nodeprep supports Kubernetes 1.27+ and no newer control plane can be had here, so the profile
says 1.27 (JoinConfiguration v1beta3, the API kubeadm 1.22-1.30 reads) and only version-independent
behaviour is asserted: token discovery, the JoinConfiguration's discovery/registration fields, the
bootstrap kubeconfig (docs/join.md "Tested against a real control plane"). GPU facts come from a
recorded nvidia-smi capture (no GPU here).
"""

from __future__ import annotations

import base64
import hashlib
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from nodeprep.cli import main
from nodeprep.join.discovery import spki_pin
from tests.support.controlplane import ControlPlane, free_port
from tests.unit.join.conftest import install_driver, write_token

pytestmark = pytest.mark.slow

CAPTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia-smi"
SMI = CAPTURES / "tesla-t4_515.105.01.xml"


def node_root(tmp_path: Path, token: str) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    install_driver(root, tmp_path / "work")
    write_token(root, token=token)
    return root


def write_profile(tmp_path: Path, cp: ControlPlane, **cluster: Any) -> Path:
    data = {
        "driver": {"version": "535.309.01"},
        "labels": {"extra": {"example.com/team": "ml"}, "cloud": "none"},
        "cluster": {
            "api_server": f"127.0.0.1:{cp.port}",
            "ca_cert_hashes": [cp.pki.ca_pin()],
            "kubernetes_version": "1.27",
            "node_name": "gpu-join-1",
            "gpu_taint": True,
            "taints": ["dedicated=gpu:NoSchedule"],
            **cluster,
        },
    }
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def snapshot(root: Path) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = f"-> {os.readlink(p)}" if p.is_symlink() else (p.read_bytes() if p.is_file() else "dir")
    return out


def join(root: Path, prof: Path, *extra: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, ["join", "--profile", str(prof), "--root", str(root), "--skip-preflight",
                                  "--nvidia-smi-xml", str(SMI), *extra], catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def signed_ids(cp: ControlPlane) -> set[str]:
    data = cp.api("GET", "/api/v1/namespaces/kube-public/configmaps/cluster-info").json().get("data", {})
    return {k.removeprefix("jws-kubeconfig-") for k in data if k.startswith("jws-kubeconfig-")}


def test_pin_matches_kubeadm() -> None:
    """nodeprep's own SPKI pin (a small DER walk, no crypto library at run time) equals the one computed
    with `cryptography`, the way kubeadm computes it."""
    import tempfile

    from tests.support.controlplane import make_pki

    with tempfile.TemporaryDirectory() as d:
        pki = make_pki(Path(d))
        assert spki_pin(pki.ca_cert.read_bytes()) == pki.ca_pin()
        cert, _ = pki.issue("x", "x", server=True)
        assert spki_pin(cert.read_bytes()) != pki.ca_pin()


def test_refused_joins_write_nothing(control_plane: ControlPlane, tmp_path: Path) -> None:
    """Each refusal is one `error:` line naming the cause, and the node root is byte-for-byte as before."""
    cp = control_plane
    good = cp.create_token()
    cp.wait("the bootstrap signer to sign cluster-info", lambda: good.split(".")[0] in signed_ids(cp))
    deleted = cp.create_token()
    expired = cp.create_token(ttl="1s")
    cp.kubeadm("token", "delete", f"--kubeconfig={cp.admin_kubeconfig}", deleted.split(".")[0])

    def gone(token: str) -> bool:
        tid = token.split(".")[0]
        secret = cp.api("GET", f"/api/v1/namespaces/kube-system/secrets/bootstrap-token-{tid}")
        return secret.status_code == 404 and tid not in signed_ids(cp)

    # The controller-manager's token cleaner deletes the expired token; no signature is left for either.
    cp.wait("the deleted and the expired token to be gone", lambda: gone(deleted) and gone(expired),
            timeout=90)
    wrong_secret = good.split(".")[0] + ".0123456789abcdef"
    cases = [
        ("wrong pin", good, {"ca_cert_hashes": ["sha256:" + "ab" * 32]}, 2,
         f"cluster.ca_cert_hashes: the cluster's CA at 127.0.0.1:{cp.port} is {cp.pki.ca_pin()}, "
         "not one of the pinned sha256:abab"),
        ("deleted token", deleted, {}, 2, f"bootstrap token {deleted[:6]} is not known to the cluster"),
        ("expired token", expired, {}, 2, f"bootstrap token {expired[:6]} is not known to the cluster"),
        ("wrong secret", wrong_secret, {}, 2, "signature of cluster-info does not match the token's secret"),
        ("unreachable", good, {"api_server": f"127.0.0.1:{free_port()}"}, 1,
         "cluster.api_server: cannot reach the API server at https://127.0.0.1:"),
    ]
    for name, token, cluster, code, message in cases:
        case = tmp_path / name.replace(" ", "-")
        case.mkdir()
        root = node_root(case, token)
        before = snapshot(root)
        got, out, err = join(root, write_profile(case, cp, **cluster), "--discovery-timeout", "2")
        assert got == code, (name, got, err)
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and message in lines[0], (name, err)
        assert token.split(".")[1] not in out + err, name
        assert snapshot(root) == before, name
    # Connection refused, said as such.
    assert "Connection refused" in lines[0]


def _kubeadm_kubelet_start(cp: ControlPlane, root: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """Run the real `kubeadm join phase kubelet-start` on nodeprep's JoinConfiguration, chrooted into the
    node root (kubeadm --rootfs). It discovers the cluster, writes the bootstrap kubeconfig, the
    kubelet's config and flags, then waits for a kubelet; the caller stops it."""
    log = root.parent / "kubeadm-join.log"
    with log.open("wb") as f:
        proc = subprocess.Popen([str(cp.bins["kubeadm"]), "join", "phase", "kubelet-start", "--config",
                                 "/etc/nodeprep/kubeadm-join.yaml", "--rootfs", str(root), "--v=1"],
                                stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    return proc, log


def test_right_pin_joins_through_kubeadm(control_plane: ControlPlane, tmp_path: Path) -> None:
    """nodeprep's check passes; the real kubeadm discovers the cluster with nodeprep's v1beta3
    JoinConfiguration (token + CA pin) and writes the bootstrap kubeconfig for the real server and CA."""
    cp = control_plane
    token = cp.create_token()
    root = node_root(tmp_path, token)
    prof = write_profile(tmp_path, cp)
    code, out, err = join(root, prof)
    assert code == 0, err
    assert "joined: mode kubeadm, Kubernetes 1.27, kubeadm.k8s.io/v1beta3" in err
    assert token.split(".")[1] not in out + err
    doc = yaml.safe_load((root / "etc/nodeprep/kubeadm-join.yaml").read_text())
    assert doc["discovery"]["bootstrapToken"]["caCertHashes"] == [cp.pki.ca_pin()]
    proc, log = _kubeadm_kubelet_start(cp, root)
    boot = root / "etc/kubernetes/bootstrap-kubelet.conf"
    try:
        cp.wait("kubeadm to write the bootstrap kubeconfig",
                lambda: boot.is_file() and (root / "var/lib/kubelet/kubeadm-flags.env").is_file()
                or proc.poll() is not None, timeout=90)
        assert boot.is_file(), log.read_text()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    kc = yaml.safe_load(boot.read_text())
    cluster = kc["clusters"][0]["cluster"]
    assert cluster["server"] == cp.server
    assert spki_pin(base64.b64decode(cluster["certificate-authority-data"])) == cp.pki.ca_pin()
    assert kc["users"][0]["user"]["token"] == token
    assert oct(boot.stat().st_mode & 0o777) == "0o600"
    flags = (root / "var/lib/kubelet/kubeadm-flags.env").read_text()
    assert "--container-runtime-endpoint=unix:///run/containerd/containerd.sock" in flags
    assert "nvidia.com/gpu.product=Tesla-T4" in flags and "example.com/team=ml" in flags
    text = log.read_text()
    assert "[kubelet-start] Writing kubelet configuration" in text or "kubelet-start" in text, text
    # kubeadm logged nothing about the token; the shared digest is all the test needs
    assert hashlib.sha256(token.encode()).hexdigest() not in text
