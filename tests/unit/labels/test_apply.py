"""`--apply`: labels onto the Node through the Kubernetes API.

No Kubernetes API server can be installed here, so a loopback http.server stands in for it at that
one boundary. It checks what a real apiserver would need from us (method, path, merge-patch content
type, bearer token or client certificate, the patch body) and can answer 409 or 500 first.
"""

from __future__ import annotations

import base64
import datetime
import json
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeprep.errors import InputError, NetworkError
from nodeprep.labels.apply import MANAGED_ANNOTATION, apply_labels, load_kubeconfig, plan_patch

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


def test_patch_body_method_and_content_type(http_server: Callable[..., Server], tmp_path: Path) -> None:
    existing = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "4",
                "nvidia.com/gpu.memory": "81559", "nodeprep.dev/flavour-old": "open",
                "nvidia.com/gfd.timestamp": "1700000000", "team": "ml", "kubernetes.io/hostname": NODE}
    srv = http_server(apiserver(labels=existing, managed=["nvidia.com/gpu.memory", "nvidia.com/gpu.product"]))
    result = apply_labels(load_kubeconfig(kubeconfig(tmp_path, srv.url)), NODE, WANTED, backoff=0.01)
    assert result.changed and result.attempts == 1
    get, patch = srv.requests
    assert (get.method, get.path) == ("GET", f"/api/v1/nodes/{NODE}")
    assert (patch.method, patch.path, patch.headers["content-type"]) == (
        "PATCH", f"/api/v1/nodes/{NODE}", "application/merge-patch+json")
    body = json.loads(patch.body)
    assert body["metadata"]["labels"] == {
        "nvidia.com/gpu.count": "8",  # changed
        "nodeprep.dev/driver-version": "550.127.05",  # new
        "node.kubernetes.io/instance-type": "p5.48xlarge",  # new
        "nvidia.com/gpu.memory": None,  # ours last time, not produced now
        "nodeprep.dev/flavour-old": None,  # our prefix, not produced now
    }  # gfd.timestamp, team, hostname: not ours, untouched; gpu.product unchanged: not sent
    assert json.loads(body["metadata"]["annotations"][MANAGED_ANNOTATION]) == sorted(WANTED)
    assert body["metadata"]["resourceVersion"] == "100"


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


def test_unchanged_node_is_not_patched(http_server: Callable[..., Server], tmp_path: Path) -> None:
    srv = http_server(apiserver(labels=dict(WANTED), managed=sorted(WANTED)))
    result = apply_labels(load_kubeconfig(kubeconfig(tmp_path, srv.url)), NODE, WANTED)
    assert not result.changed and [r.method for r in srv.requests] == ["GET"]


def test_unknown_node_and_bad_token(http_server: Callable[..., Server], tmp_path: Path) -> None:
    srv = http_server(apiserver())
    with pytest.raises(InputError, match="node 'nope' not found"):
        apply_labels(load_kubeconfig(kubeconfig(tmp_path, srv.url)), "nope", WANTED)
    with pytest.raises(Exception, match="not allowed to patch node"):
        apply_labels(load_kubeconfig(kubeconfig(tmp_path, srv.url, token="wrong")), NODE, WANTED)


def test_token_file(http_server: Callable[..., Server], tmp_path: Path) -> None:
    srv = http_server(apiserver())
    (tmp_path / "token").write_text(TOKEN + "\n")
    cfg = load_kubeconfig(kubeconfig(tmp_path, srv.url, tokenFile="token"))
    assert apply_labels(cfg, NODE, WANTED).changed


def test_bad_kubeconfig(tmp_path: Path) -> None:
    p = tmp_path / "kc"
    p.write_text("clusters: [{name: a, cluster: {server: ftp://x}}]\n")
    with pytest.raises(InputError, match="is not an http\\(s\\) URL"):
        load_kubeconfig(p)
    with pytest.raises(InputError, match="missing: file not found"):
        load_kubeconfig(tmp_path / "missing")


def test_plan_patch_pure() -> None:
    node = node_object({"a.io/x": "1"}, managed=["a.io/x", "a.io/gone"])
    assert plan_patch(node, {"a.io/x": "1"}) == {
        "metadata": {"annotations": {MANAGED_ANNOTATION: '["a.io/x"]'}, "resourceVersion": "100"}}
    assert plan_patch(node_object({"a.io/x": "1"}, managed=["a.io/x"]), {"a.io/x": "1"}) is None


# --- TLS: CA verification and client certificates -----------------------------------------------------

def _certs(tmp_path: Path) -> dict[str, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def pem_key(k: ec.EllipticCurvePrivateKey) -> bytes:
        return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                               serialization.NoEncryption())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("test-ca")).issuer_name(name("test-ca"))
          .public_key(ca_key.public_key()).serial_number(1).not_valid_before(now)
          .not_valid_after(now + datetime.timedelta(hours=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    out = {"ca": ca.public_bytes(serialization.Encoding.PEM)}
    for who, san in (("server", True), ("client", False)):
        key = ec.generate_private_key(ec.SECP256R1())
        b = (x509.CertificateBuilder()
             .subject_name(name("kubernetes-admin" if who == "client" else "apiserver"))
             .issuer_name(ca.subject).public_key(key.public_key()).serial_number(2 if san else 3)
             .not_valid_before(now).not_valid_after(now + datetime.timedelta(hours=1)))
        if san:
            import ipaddress

            b = b.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        out[who] = b.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
        out[who + "-key"] = pem_key(key)
    return out


def test_tls_ca_and_client_certificate(tmp_path: Path) -> None:
    """HTTPS with the kubeconfig's CA (inline *-data) and client certificate: the stand-in requires a
    client certificate signed by the CA and records its common name."""
    certs = _certs(tmp_path)
    for k, v in certs.items():
        (tmp_path / f"{k}.pem").write_bytes(v)
    seen: list[str] = []

    class H(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            peer = self.connection.getpeercert()  # type: ignore[attr-defined]
            seen.append(dict(x[0] for x in peer["subject"])["commonName"])
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            body = json.dumps(node_object({})).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PATCH = _serve

        def log_message(self, *a: Any) -> None:
            pass

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "server.pem", tmp_path / "server-key.pem")
    ctx.load_verify_locations(tmp_path / "ca.pem")
    ctx.verify_mode = ssl.CERT_REQUIRED
    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        url = f"https://127.0.0.1:{srv.server_address[1]}"
        b64 = {k: base64.b64encode(v).decode() for k, v in certs.items()}
        path = tmp_path / "kubelet.conf"
        path.write_text(yaml.safe_dump({
            "clusters": [{"name": "c", "cluster": {"server": url, "certificate-authority-data": b64["ca"]}}],
            "users": [{"name": "u",
                       "user": {"client-certificate": "client.pem", "client-key": "client-key.pem"}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}], "current-context": "x"}))
        result = apply_labels(load_kubeconfig(path), NODE, WANTED)
        assert result.changed and seen == ["kubernetes-admin", "kubernetes-admin"]
        # Without the CA the server certificate is refused.
        path.write_text(path.read_text().replace("certificate-authority-data", "unused"))
        with pytest.raises(NetworkError, match="TLS verification failed"):
            apply_labels(load_kubeconfig(path), NODE, WANTED, attempts=1)
    finally:
        srv.shutdown()
        srv.server_close()
