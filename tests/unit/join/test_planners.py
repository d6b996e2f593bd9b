"""The join's pure planners (nodeprep.join.joinplan) on explicit inputs: what a live node would run, which
a test could only see before by planning against this machine's own / (kubelet.conf, systemd)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeprep.errors import InputError
from nodeprep.join.joinplan import checked_cluster, kubeadm_actions, kubelet_actions, kubelet_args
from nodeprep.profile import parse_profile

from .conftest import CA_HASH

LIVE = Path("/")


def argv(actions):  # type: ignore[no-untyped-def]
    return [" ".join(a.argv) for a in actions if not a.deferred]


def test_kubelet_mode_on_a_live_node() -> None:
    assert argv(kubelet_actions(LIVE, changed=True, joined=True, live=True)) == [
        "systemctl daemon-reload", "systemctl enable kubelet.service", "systemctl restart kubelet.service"]
    assert argv(kubelet_actions(LIVE, changed=False, joined=False, live=True)) == [
        "systemctl restart kubelet.service"]  # not joined yet: start it even though nothing changed
    assert kubelet_actions(LIVE, changed=False, joined=True, live=True) == []
    image = kubelet_actions(Path("/img"), changed=True, joined=False, live=False)
    assert argv(image) == ["env SYSTEMCTL_SKIP_SYSV=1 systemctl --root=/img enable kubelet.service"]


def test_kubeadm_mode_on_a_live_node() -> None:
    actions, warnings = kubeadm_actions(LIVE, joined=False, live=True)
    assert argv(actions) == ["kubeadm join --config /etc/nodeprep/kubeadm-join.yaml"] and warnings == []
    actions, warnings = kubeadm_actions(LIVE, joined=True, live=True)
    assert actions == [] and warnings == [
        "/etc/kubernetes/kubelet.conf exists: the node has already joined; not running kubeadm join"]
    actions, warnings = kubeadm_actions(Path("/img"), joined=False, live=False)
    assert [a.deferred for a in actions] == [True] and warnings[0].startswith("--root /img: not running")


def test_cluster_checks_and_kubelet_arguments() -> None:
    def profile(**cluster: object):  # type: ignore[no-untyped-def]
        return parse_profile({"driver": {"version": "535.309.01"}, "runtime": {"cdi": True},
                              "cluster": {"api_server": "10.0.0.10:6443", **cluster}},
                             insecure_skip_ca_verification=True)

    kubelet = profile(mode="kubelet")
    with pytest.raises(InputError, match="cluster.ca_cert_file: /etc/kubernetes/pki/ca.crt does not exist"):
        checked_cluster(kubelet, insecure=False, ca_cert_present=False)
    assert checked_cluster(kubelet, insecure=False, ca_cert_present=True) is kubelet.cluster
    assert checked_cluster(kubelet, insecure=True, ca_cert_present=None) is kubelet.cluster
    with pytest.raises(InputError, match="ca_cert_hashes"):
        checked_cluster(profile(), insecure=False, ca_cert_present=None)
    old = profile(ca_cert_hashes=[CA_HASH], kubernetes_version="1.28", kubelet_extra_args={"max-pods": "110"})
    args, warnings = kubelet_args(old, old.cluster)
    assert args.config["featureGates"] == {"DevicePluginCDIDevices": True} and args.moved == ("max-pods",)
    assert [w.split(" gate ")[0].split(" flags ")[0] for w in warnings] == [
        "enabled kubelet feature", "moved deprecated kubelet"]
