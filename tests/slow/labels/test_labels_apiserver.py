"""`nodeprep labels --apply` against a real kube-apiserver (v1.24.0-alpha.3, NodeRestriction + Node,RBAC;
tests/support/controlplane.py): the self_settable / needs_api split checked key by key against the
real admission plugin, the node's own credential applying what it may and naming the rest, and the
merge-patch semantics (nodeprep's keys only, unchanged Node not patched, 404/401, TLS, token).

GPU facts come from a recorded `nvidia-smi -q -x` capture (tests/fixtures/nvidia-smi): there is no GPU
here. The NodeRestriction rules for labels have not changed since 1.16, so what is checked here holds
for the 1.27+ clusters nodeprep targets too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import requests
from click.testing import CliRunner

from nodeprep.cli import main
from nodeprep.errors import InputError, NetworkError, NodeprepError
from nodeprep.kubeapi import load_kubeconfig
from nodeprep.labels.core import LabelOptions, node_labels
from nodeprep.labels.nodepatch import MANAGED_ANNOTATION, apply_labels
from nodeprep.labels.validate import self_settable, split_for_kubelet
from tests.support.controlplane import ControlPlane, kubeconfig

pytestmark = pytest.mark.slow

CAPTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia-smi"
TRICKY = {
    "node-role.kubernetes.io/gpu": "",
    "node-role.kubernetes.io/worker": "true",
    "node-restriction.kubernetes.io/pool": "gpu",
    "sub.node-restriction.kubernetes.io/x": "y",
    "kubernetes.io/hostname": "",  # value: the node's name (filled in below)
    "kubernetes.io/role": "gpu",
    "topology.kubernetes.io/zone": "zone-a",
    "topology.kubernetes.io/region": "region-1",
    "node.kubernetes.io/instance-type": "p4d.24xlarge",
    "node.kubernetes.io/gpu-pool": "a100",
    "kubelet.kubernetes.io/gpu": "true",
    "k8s.io/gpu": "true",
    "sub.k8s.io/gpu": "true",
    "example.kubernetes.io/gpu": "true",
    "kubernetes.io/os": "linux",
    "beta.kubernetes.io/instance-type": "p4d.24xlarge",
    "example.com/team": "ml",
    "nodeprep.dev/probe": "1",
}


def _dirs(tmp_path: Path) -> dict[str, Path]:
    root, sysfs, dmi = tmp_path / "root", tmp_path / "sys", tmp_path / "dmi"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "os-release").write_text('ID=debian\nVERSION_ID="12"\n')
    (sysfs / "bus" / "pci" / "devices").mkdir(parents=True)
    dmi.mkdir()
    (dmi / "sys_vendor").write_text("Amazon EC2\n")
    (dmi / "product_name").write_text("p4d.24xlarge\n")
    return {"root": root, "sys": sysfs, "dmi": dmi}


def produced_labels(tmp_path: Path, capture: str = "a100-sxm4-80gb-mig_535.54.03.xml") -> dict[str, str]:
    d = _dirs(tmp_path)
    return node_labels(LabelOptions(root=d["root"], sysfs_root=d["sys"], dmi_root=d["dmi"], cloud="none",
                                    nvidia_smi_xml=CAPTURES / capture, kernel="6.1.0-28-amd64",
                                    use_nvml=False, run_nvidia_smi=False, mig_strategy="mixed")).labels


def cli_args(tmp_path: Path, capture: str = "tesla-t4_515.105.01.xml") -> list[str]:
    d = _dirs(tmp_path)
    return ["labels", "--root", str(d["root"]), "--sysfs-root", str(d["sys"]), "--dmi-root", str(d["dmi"]),
            "--nvidia-smi-xml", str(CAPTURES / capture), "--cloud", "none"]


def create_node(cp: ControlPlane, name: str, labels: dict[str, str] | None = None,
                session: requests.Session | None = None) -> requests.Response:
    return cp.api("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                            "metadata": {"name": name, "labels": labels or {}}},
                  session=session)


def get_node(cp: ControlPlane, name: str) -> dict[str, Any]:
    r = cp.api("GET", f"/api/v1/nodes/{name}")
    r.raise_for_status()
    return r.json()


def test_split_matches_node_restriction_key_by_key(control_plane: ControlPlane, tmp_path: Path) -> None:
    """Every label nodeprep produces (A100 MIG capture, mixed strategy, AWS DMI) and each tricky key,
    sent alone by the node's own credential: the real NodeRestriction admits it exactly when
    `self_settable` says so — on registration (create) and on update."""
    cp, name = control_plane, "np-split"
    s = cp.node_session(name)
    keys = {**produced_labels(tmp_path), **TRICKY, "kubernetes.io/hostname": name}
    assert len(keys) > 30
    # Registration: refused with any label it may not set, accepted with all it may.
    mine, api = split_for_kubelet(keys)
    for key in sorted(api):
        r = create_node(cp, name, {key: keys[key]}, session=s)
        assert r.status_code == 403, (key, r.status_code, r.text)
        assert key in r.json()["message"]
    r = create_node(cp, name, mine, session=s)
    assert r.status_code == 201, r.text
    labels = get_node(cp, name)["metadata"]["labels"]
    # all of them landed (the node lifecycle controller may add beta.kubernetes.io/os beside kubernetes.io/os)
    assert {k: labels.get(k) for k in mine} == mine
    # Update: every key alone, with a new value (admission looks only at modified labels).
    verdicts = {}
    for key in sorted(keys):
        value = "changed" if key != "kubernetes.io/hostname" else "other-name"
        r = cp.api("PATCH", f"/api/v1/nodes/{name}", {"metadata": {"labels": {key: value}}}, session=s,
                   content_type="application/merge-patch+json")
        assert r.status_code in (200, 403), (key, r.status_code, r.text)
        verdicts[key] = r.status_code == 200
    assert set(verdicts.values()) == {True, False}
    disagree = {k: v for k, v in verdicts.items() if v != self_settable(k)}
    assert disagree == {}, f"NodeRestriction admitted (True) / refused (False) against the split: {disagree}"
    # And the node may not touch another Node at all.
    assert create_node(cp, "np-split-other", {"example.com/x": "1"}, session=s).status_code == 403


def test_apply_with_node_credential_sets_what_it_may_and_names_the_rest(control_plane: ControlPlane,
                                                                        tmp_path: Path) -> None:
    """The profile adds `node-role.kubernetes.io/gpu`: with the node's own kubeconfig every self-settable
    label lands, the node-role label does not, and one line names it and what to use instead (exit 1).
    An admin kubeconfig then applies it; the node credential's next run changes nothing (exit 0)."""
    cp, name = control_plane, "np-apply-node"
    s = cp.node_session(name)
    assert create_node(cp, name, {"kubernetes.io/hostname": name}, session=s).status_code == 201
    node_conf = cp.node_credential(name)
    args = [*cli_args(tmp_path), "--label", "node-role.kubernetes.io/gpu=", "--label", "example.com/team=ml",
            "--node", name, "--apply"]
    r = CliRunner().invoke(main, [*args, "--kubeconfig", str(node_conf)], catch_exceptions=False)
    assert r.exit_code == 1, r.stderr
    err = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "not applied: node-role.kubernetes.io/gpu" in err[0]
    assert "--kubeconfig" in err[0] and "NodeRestriction" in err[0]
    out = json.loads(r.stdout)
    assert out["needs_api"] == ["node-role.kubernetes.io/gpu"] and len(out["self_settable"]) >= 20
    assert out["applied"]["refused"] == ["node-role.kubernetes.io/gpu"]
    labels = get_node(cp, name)["metadata"]["labels"]
    mine = out["self_settable"]
    assert {k: labels.get(k) for k in mine} == {k: out["labels"][k] for k in mine}
    assert "node-role.kubernetes.io/gpu" not in labels
    managed = json.loads(get_node(cp, name)["metadata"]["annotations"][MANAGED_ANNOTATION])
    assert managed == sorted(out["self_settable"])
    # The credential meant for it.
    r = CliRunner().invoke(main, [*args, "--kubeconfig", str(cp.admin_kubeconfig)], catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    labels = get_node(cp, name)["metadata"]["labels"]
    assert labels["node-role.kubernetes.io/gpu"] == "" and labels["example.com/team"] == "ml"
    rv = get_node(cp, name)["metadata"]["resourceVersion"]
    r = CliRunner().invoke(main, [*args, "--kubeconfig", str(node_conf)], catch_exceptions=False)
    assert r.exit_code == 0 and "labels unchanged" in r.stderr, r.stderr
    assert get_node(cp, name)["metadata"]["resourceVersion"] == rv


def test_patch_touches_only_nodeprep_labels(control_plane: ControlPlane, tmp_path: Path) -> None:
    """Labels nodeprep set before but no longer produces are removed; labels of others stay; a Node that
    already carries everything is not patched (its resourceVersion does not move)."""
    cp, name = control_plane, "np-patch"
    existing = {"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "4",
                "nvidia.com/gpu.memory": "1", "nodeprep.dev/flavour-old": "open", "team": "ml",
                "kubernetes.io/hostname": name}
    r = cp.api("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "labels": existing,
        "annotations": {MANAGED_ANNOTATION: json.dumps(["nvidia.com/gpu.memory",
                                                         "nvidia.com/gpu.product"])}}})
    assert r.status_code == 201, r.text
    wanted = {"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "1",
              "nodeprep.dev/driver-version": "515.105.01", "node.kubernetes.io/instance-type": "g4dn.xlarge"}
    cfg = load_kubeconfig(cp.admin_kubeconfig)
    result = apply_labels(cfg, name, wanted)
    assert result.changed and result.refused == ()
    labels = get_node(cp, name)["metadata"]["labels"]
    assert labels == {**wanted, "team": "ml", "kubernetes.io/hostname": name}
    rv = get_node(cp, name)["metadata"]["resourceVersion"]
    again = apply_labels(cfg, name, wanted)
    assert not again.changed and again.patch is None
    assert get_node(cp, name)["metadata"]["resourceVersion"] == rv


def test_unknown_node_bad_credentials_tls_and_token(control_plane: ControlPlane, tmp_path: Path) -> None:
    """404 → InputError; a wrong token (401) and another node's certificate (403) → NodeprepError; a
    kubeconfig without the cluster's CA → TLS verification failed; a tokenFile credential works."""
    cp, name = control_plane, "np-auth"
    assert create_node(cp, name).status_code == 201
    wanted = {"example.com/x": "1"}
    with pytest.raises(InputError, match="node 'nope' not found"):
        apply_labels(load_kubeconfig(cp.admin_kubeconfig), "nope", wanted)
    bad = kubeconfig(tmp_path / "bad.conf", cp.server, cp.pki.ca_cert, token="not-a-valid-token")
    with pytest.raises(NodeprepError, match="not allowed to patch node .*HTTP 401"):
        apply_labels(load_kubeconfig(bad), name, wanted)
    other = cp.node_credential("np-auth-other")
    with pytest.raises(NodeprepError, match="not allowed to patch node .*HTTP 403"):
        apply_labels(load_kubeconfig(other), name, wanted)
    (tmp_path / "token").write_text(cp.admin_token + "\n")
    tf = tmp_path / "tf.conf"
    tf.write_text(bad.read_text().replace("token: not-a-valid-token", "tokenFile: token"))
    assert apply_labels(load_kubeconfig(tf), name, wanted).changed
    noca = tmp_path / "noca.conf"
    noca.write_text(bad.read_text().replace("certificate-authority-data", "unused"))
    with pytest.raises(NetworkError, match="TLS verification failed"):
        apply_labels(load_kubeconfig(noca), name, wanted, attempts=1)
