"""Check the join inputs against the cluster before anything is written: kubeadm's token discovery.

The API server's `kube-public/cluster-info` ConfigMap (readable anonymously) holds the cluster's
kubeconfig and, per bootstrap token, a detached JWS (`jws-kubeconfig-<token id>`, HS256 keyed with the
token's secret) made by the controller-manager's bootstrap signer. nodeprep fetches it without
trusting the server's certificate (nothing in it is trusted until verified), then checks:

1. the token is known: its signature is there (a deleted or expired token's is removed; a new one's
   appears within seconds, so nodeprep waits up to `timeout`);
2. the signature matches the token's secret (otherwise: a wrong token, or an impostor server);
3. the CA in the signed kubeconfig matches a pin in `cluster.ca_cert_hashes` (kubeadm mode: sha256 of
   its SubjectPublicKeyInfo) or the certificate in `cluster.ca_cert_file` (kubelet mode).

Each failure is one line (InputError, exit 2; an unreachable server: NetworkError, exit 1) and the node
is left as it was. The same checks kubeadm makes; doing them first means a refused join writes nothing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import re
import time
import warnings
from dataclasses import dataclass
from typing import Any

import yaml

from ..errors import InputError, NetworkError
from .token import BootstrapToken

log = logging.getLogger(__name__)

CLUSTER_INFO = "/api/v1/namespaces/kube-public/configmaps/cluster-info"


@dataclass(frozen=True)
class Discovery:
    """What to check: the endpoint, and the CA pins or the CA certificate (PEM) the node trusts."""

    api_server: str  # HOST:PORT
    ca_cert_hashes: tuple[str, ...] = ()
    ca_cert_pem: bytes | None = None  # kubelet mode: cluster.ca_cert_file
    insecure_skip_ca_verification: bool = False
    timeout: float = 60.0


@dataclass(frozen=True)
class ClusterInfo:
    server: str
    ca_pin: str


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _der_element(der: bytes, i: int) -> tuple[int, int, int]:
    """(tag, start of value, end of element) of the DER element at offset i."""
    tag, n = der[i], der[i + 1]
    i += 2
    if n & 0x80:
        k = n & 0x7F
        n = int.from_bytes(der[i:i + k], "big")
        i += k
    return tag, i, i + n


def spki_pin(pem: bytes) -> str:
    """kubeadm's CA pin of the first certificate in `pem`: sha256 of its DER SubjectPublicKeyInfo."""
    text = pem.decode("ascii", errors="replace")
    begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    if begin not in text or end not in text.split(begin, 1)[1]:
        raise ValueError("no PEM certificate")
    body = text.split(begin, 1)[1].split(end, 1)[0]
    der = base64.b64decode("".join(body.split()), validate=True)
    _, i, _ = _der_element(der, 0)  # Certificate
    _, i, _ = _der_element(der, i)  # tbsCertificate: its first field
    tag, _, nxt = _der_element(der, i)
    if tag == 0xA0:  # [0] version
        i = nxt
    for _ in range(5):  # serialNumber, signature, issuer, validity, subject
        i = _der_element(der, i)[2]
    tag, _, end_spki = _der_element(der, i)
    if tag != 0x30:
        raise ValueError("malformed certificate")
    return "sha256:" + hashlib.sha256(der[i:end_spki]).hexdigest()


def verify_jws(signature: str, payload: str, token: BootstrapToken) -> bool:
    """The detached JWS (`header..sig`, HS256 keyed with the token secret) signs `payload`."""
    parts = signature.split(".")
    if len(parts) != 3 or parts[1]:
        return False
    try:
        header = json.loads(base64.urlsafe_b64decode(parts[0] + "=" * (-len(parts[0]) % 4)))
    except ValueError:
        return False
    if not isinstance(header, dict) or header.get("alg") != "HS256":
        return False
    if header.get("kid") not in (None, token.id):
        return False
    signing_input = f"{parts[0]}.{_b64url(payload.encode())}".encode()
    expected = _b64url(hmac.new(token._secret.encode(), signing_input, hashlib.sha256).digest())
    return hmac.compare_digest(expected, parts[2])


def _fetch(url: str, timeout: float) -> dict[str, Any]:
    # lazy: Ansible nodeprep_join, Ansible nodeprep_runtime
    import requests
    import urllib3

    try:
        with warnings.catch_warnings():
            # Deliberately unverified: the content is trusted only after the JWS and the CA pin check.
            warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
            r = requests.get(url, timeout=timeout, verify=False,
                             headers={"Accept": "application/json", "User-Agent": "nodeprep-join"})
    except requests.RequestException as e:
        m = re.search(r"\[Errno -?\d+\] ([^'\")]+)", str(e))
        reason = m.group(1) if m else ("timed out" if isinstance(e, requests.Timeout) else type(e).__name__)
        raise NetworkError(f"cluster.api_server: cannot reach the API server at {url.split('/api/')[0]} "
                           f"({reason})",
                           hint="check cluster.api_server and the network path to it") from None
    if r.status_code != 200:
        raise NetworkError(f"cluster.api_server: {url.split('/api/')[0]} answered HTTP {r.status_code} for "
                           "kube-public/cluster-info (is it a kubeadm-style cluster with bootstrap tokens?)")
    try:
        data = r.json().get("data") or {}
    except (ValueError, AttributeError):
        raise NetworkError(f"cluster.api_server: {url.split('/api/')[0]}: cluster-info is not JSON") from None
    return data if isinstance(data, dict) else {}


def discover(d: Discovery, token: BootstrapToken, *, poll: float = 1.0) -> ClusterInfo:
    """Verify token and CA against the live cluster-info; ClusterInfo on success, one-line errors else."""
    url = f"https://{d.api_server}{CLUSTER_INFO}"
    key = f"jws-kubeconfig-{token.id}"
    deadline = time.monotonic() + d.timeout
    waited = False
    while True:
        data = _fetch(url, timeout=min(10.0, max(1.0, d.timeout)))
        if key in data:
            break
        if time.monotonic() >= deadline:
            raise InputError(
                f"cluster.token_file: bootstrap token {token.id} is not known to the cluster at "
                f"{d.api_server} (no signature for it in kube-public/cluster-info after {d.timeout:.0f}s: "
                "deleted, expired, or the controller-manager's bootstrap signer is not running)",
                hint="create a new token (kubeadm token create) and write it to cluster.token_file")
        (log.debug if waited else log.info)(
            "join: waiting up to %.0fs for the bootstrap signer to sign cluster-info for token %s",
            d.timeout, token.id)
        waited = True
        time.sleep(poll)
    kubeconfig = data.get("kubeconfig")
    if not isinstance(kubeconfig, str) or not verify_jws(str(data[key]), kubeconfig, token):
        raise InputError(
            f"cluster.token_file: bootstrap token {token.id}: the cluster's signature of cluster-info does "
            f"not match the token's secret (a wrong token, or {d.api_server} is not its cluster)")
    try:
        doc = yaml.safe_load(kubeconfig)
        cluster = doc["clusters"][0]["cluster"]
        ca = base64.b64decode(cluster["certificate-authority-data"])
        pin = spki_pin(ca)
        server = str(cluster["server"])
    except (yaml.YAMLError, KeyError, IndexError, TypeError, ValueError):
        raise NetworkError(f"cluster.api_server: {d.api_server}: cluster-info holds no usable CA") from None
    if d.insecure_skip_ca_verification:
        return ClusterInfo(server, pin)
    if d.ca_cert_pem is not None:
        try:
            mine = spki_pin(d.ca_cert_pem)
        except ValueError:
            raise InputError("cluster.ca_cert_file: not a PEM certificate") from None
        if mine != pin:
            raise InputError(f"cluster.ca_cert_file: its CA ({mine}) is not the cluster's CA ({pin}) at "
                             f"{d.api_server}")
    elif pin not in d.ca_cert_hashes:
        raise InputError(
            f"cluster.ca_cert_hashes: the cluster's CA at {d.api_server} is {pin}, not one of the pinned "
            f"{', '.join(d.ca_cert_hashes)} (wrong pin, or not the cluster you meant)",
            hint="kubeadm token create --print-join-command on a control-plane node prints the right pin")
    return ClusterInfo(server, pin)
