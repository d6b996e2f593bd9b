"""Pure parts of join discovery (CA pin, detached JWS) and of the GPU-verification controller. The
live behaviour (a real kube-apiserver and controller-manager) is in tests/slow/join/."""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import json
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from nodeprep.join.discovery import spki_pin, verify_jws
from nodeprep.join.token import BootstrapToken
from nodeprep.join.verification import FAILED, reconcile, verdict_digest, verdict_patch
from nodeprep.node.selftest import Verdict


@pytest.mark.parametrize("key", [ec.generate_private_key(ec.SECP256R1()),
                                 rsa.generate_private_key(65537, 2048)])
def test_pin_is_sha256_of_the_spki(key) -> None:  # type: ignore[no-untyped-def]
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ca")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(7).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    spki = key.public_key().public_bytes(serialization.Encoding.DER,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)
    pem = cert.public_bytes(serialization.Encoding.PEM)
    assert spki_pin(pem) == "sha256:" + hashlib.sha256(spki).hexdigest()
    with pytest.raises(ValueError):
        spki_pin(b"not a certificate")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_detached_jws() -> None:
    token = BootstrapToken("abcdef", "0123456789abcdef")
    payload = "apiVersion: v1\nkind: Config\n"
    header = _b64(json.dumps({"alg": "HS256", "kid": "abcdef"}).encode())
    signing_input = f"{header}.{_b64(payload.encode())}".encode()
    sig = _b64(hmac.new(b"0123456789abcdef", signing_input, hashlib.sha256).digest())
    assert verify_jws(f"{header}..{sig}", payload, token)
    assert not verify_jws(f"{header}..{sig}", payload + " ", token)
    assert not verify_jws(f"{header}..{sig}", payload, BootstrapToken("abcdef", "ffffffffffffffff"))
    assert not verify_jws(f"{header}.x.{sig}", payload, token)
    assert not verify_jws("garbage", payload, token)


def _node(taints: list[dict[str, str]], label: str | None, boot: str = "b1") -> dict[str, object]:
    labels = {"nodeprep.dev/driver-version": "535.54.03"}
    if label is not None:
        labels["nodeprep.dev/gpu-verified"] = label
    return {"metadata": {"name": "n1", "resourceVersion": "5", "labels": labels},
            "spec": {"taints": taints}, "status": {"nodeInfo": {"bootID": boot}}}


TAINT = {"key": "nodeprep.dev/unverified", "effect": "NoSchedule"}
OTHER = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}


def test_reconcile() -> None:
    good = verdict_digest("n1", "b1", "535.54.03")
    patch, why = reconcile(_node([OTHER, TAINT], good))
    assert patch == {"spec": {"taints": [OTHER]}, "metadata": {"resourceVersion": "5"}} and "removed" in why
    assert reconcile(_node([OTHER, TAINT], FAILED)) == (None, "unchanged")
    assert reconcile(_node([OTHER, TAINT], good, boot="b2")) == (None, "unchanged")
    patch, why = reconcile(_node([OTHER], good, boot="b2"))
    assert patch is not None and patch["spec"]["taints"] == [OTHER, TAINT] and "stale" in why
    patch, why = reconcile(_node([], None))
    assert patch is not None and "no verdict" in why
    assert reconcile({"metadata": {"name": "cpu-node", "labels": {}}, "spec": {}}) == (None, "unchanged")


UNHEALTHY = {"key": "nodeprep.dev/gpu-unhealthy", "effect": "NoSchedule"}


def test_reconcile_the_unhealthy_taint_follows_gpuhealthy() -> None:
    """`nodeprep health` writes GPUHealthy; the controller adds the unhealthy taint while it is False
    and lifts it when it is True or gone, beside the unverified taint's rule."""
    good = verdict_digest("n1", "b1", "535.54.03")

    def with_health(node: dict[str, Any], status: str | None) -> dict[str, Any]:
        if status is not None:
            node["status"]["conditions"] = [{"type": "Ready", "status": "True"},
                                            {"type": "GPUHealthy", "status": status, "reason": "XID79"}]
        return node

    patch, why = reconcile(with_health(_node([OTHER], good), "False"))
    assert patch is not None and patch["spec"]["taints"] == [OTHER, UNHEALTHY]
    assert why == "GPUHealthy=False (XID79): nodeprep.dev/gpu-unhealthy:NoSchedule added"
    assert reconcile(with_health(_node([OTHER, UNHEALTHY], good), "False")) == (None, "unchanged")
    patch, why = reconcile(with_health(_node([UNHEALTHY, OTHER], good), "True"))
    assert patch is not None and patch["spec"]["taints"] == [OTHER] and "removed" in why
    patch, why = reconcile(with_health(_node([UNHEALTHY], good), None))
    assert patch is not None and patch["spec"]["taints"] == [] and "no GPUHealthy condition" in why
    patch, why = reconcile(with_health(_node([], None), "False"))  # both rules at once
    assert patch is not None and patch["spec"]["taints"] == [TAINT, UNHEALTHY] and "no verdict" in why


def test_verdict_patch_binds_boot_and_driver() -> None:
    ok = Verdict(True, (), driver_version="535.54.03")
    patch, pub = verdict_patch(_node([TAINT], None), ok, "b1")
    assert pub.passed and patch["metadata"]["labels"]["nodeprep.dev/gpu-verified"] == verdict_digest(
        "n1", "b1", "535.54.03")
    _, pub = verdict_patch(_node([TAINT], None), ok, "b-other")
    assert not pub.passed and pub.value == FAILED and "has not reported this boot" in pub.problems[0]
    _, pub = verdict_patch(_node([TAINT], None), Verdict(True, (), driver_version="550.1"), "b1")
    assert not pub.passed and "tested driver is '550.1'" in pub.problems[0]


def test_reconcile_a_silent_or_unknown_gpuhealthy_taints() -> None:
    """A GPUHealthy condition whose heartbeat is older than the bound counts as Unknown: the node is
    tainted with a reason saying the reporter is silent; a fresh heartbeat lifts it. Unknown taints."""
    from datetime import UTC, datetime, timedelta

    good = verdict_digest("n1", "b1", "535.54.03")
    now = datetime(2026, 12, 2, 1, 0, 0, tzinfo=UTC)

    def beat(node: dict[str, Any], status: str, age: float) -> dict[str, Any]:
        stamp = (now - timedelta(seconds=age)).strftime("%Y-%m-%dT%H:%M:%SZ")
        node["status"]["conditions"] = [{"type": "GPUHealthy", "status": status, "reason": "GPUsHealthy",
                                         "lastHeartbeatTime": stamp}]
        return node

    patch, why = reconcile(beat(_node([OTHER], good), "True", 200), now, 180)
    assert patch is not None and patch["spec"]["taints"] == [OTHER, UNHEALTHY]
    assert why == ("GPUHealthy counts as Unknown: its heartbeat is 200s old (bound 180s), the health "
                   "reporter is silent: nodeprep.dev/gpu-unhealthy:NoSchedule added")
    assert reconcile(beat(_node([OTHER, UNHEALTHY], good), "True", 200), now, 180) == (None, "unchanged")
    patch, why = reconcile(beat(_node([OTHER, UNHEALTHY], good), "True", 5), now, 180)
    assert patch is not None and patch["spec"]["taints"] == [OTHER]
    assert why == "GPUHealthy=True with a fresh heartbeat: nodeprep.dev/gpu-unhealthy:NoSchedule removed"
    assert reconcile(beat(_node([OTHER], good), "True", 5), now, 180) == (None, "unchanged")
    patch, why = reconcile(beat(_node([OTHER], good), "Unknown", 5), now, 180)
    assert patch is not None and why.startswith("GPUHealthy=Unknown (GPUsHealthy)")
    node = beat(_node([OTHER], good), "True", 5)
    node["status"]["conditions"][0]["lastHeartbeatTime"] = "yesterday"
    assert "heartbeat is unreadable" in reconcile(node, now, 180)[1]
    # without a clock (a caller that does not judge heartbeats) only the status counts
    assert reconcile(beat(_node([OTHER], good), "True", 10**6)) == (None, "unchanged")
