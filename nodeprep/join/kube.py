"""Renderers for the Kubernetes side of a join (pure functions: data in, bytes out).

- kubeadm JoinConfiguration: kubeadm.k8s.io/v1beta3 below 1.31, v1beta4 from 1.31 (list-form
  kubeletExtraArgs, `timeouts`); nodeRegistration carries name, criSocket, taints and node labels.
- KubeletConfiguration (kubelet.config.k8s.io/v1beta1): for kubeadm as a `kubeletconfiguration`
  patch (kubeadm `patches.directory`, target available since kubeadm 1.25), for mode kubelet as
  the kubelet's --config file.
- mode kubelet: bootstrap kubeconfig (token inside, 0600) and a systemd drop-in for kubelet.service.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from ..kubeletflags import SortedArgs
from ..profile import Cluster, Taint
from .token import BootstrapToken

KUBEADM_V1BETA4_FROM = (1, 31)
JOIN_CONFIG = "/etc/nodeprep/kubeadm-join.yaml"
PATCHES_DIR = "/etc/nodeprep/kubeadm-patches"
KUBELET_PATCH = f"{PATCHES_DIR}/kubeletconfiguration+merge.yaml"
BOOTSTRAP_KUBECONFIG = "/etc/kubernetes/bootstrap-kubelet.conf"
KUBECONFIG = "/etc/kubernetes/kubelet.conf"
KUBELET_CONFIG = "/var/lib/kubelet/config.yaml"
KUBELET_DROP_IN = "/etc/systemd/system/kubelet.service.d/10-nodeprep.conf"
KUBELET_BIN = "/usr/bin/kubelet"
PKI_DIR = "/var/lib/kubelet/pki"


def kubeadm_api(minor: tuple[int, int]) -> str:
    return "kubeadm.k8s.io/v1beta4" if minor >= KUBEADM_V1BETA4_FROM else "kubeadm.k8s.io/v1beta3"


def node_labels_arg(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _taints(taints: tuple[Taint, ...]) -> list[dict[str, str]]:
    return [t.to_dict() for t in taints]


HEADER = "# Written by nodeprep join; rewritten on the next join, removed by nodeprep uninstall.\n"


def dump(doc: Mapping[str, Any]) -> bytes:
    """YAML in the order the renderers build it (apiVersion and kind first), after nodeprep's
    header (how `nodeprep uninstall` knows the file is nodeprep's: join/removal.py)."""
    return (HEADER + yaml.safe_dump(dict(doc), sort_keys=False, default_flow_style=False)).encode()


def join_configuration(
    cluster: Cluster,
    token: BootstrapToken,
    *,
    labels: Mapping[str, str],
    args: SortedArgs,
    insecure_skip_ca_verification: bool = False,
    with_patches: bool = True,
) -> dict[str, Any]:
    """The JoinConfiguration document as data."""
    api = kubeadm_api(cluster.minor)
    extra: dict[str, str] = dict(sorted(args.flags.items()))
    if labels:
        extra["node-labels"] = node_labels_arg(labels)
    registration: dict[str, Any] = {}
    if cluster.node_name:
        registration["name"] = cluster.node_name
    registration["criSocket"] = cluster.cri_socket
    registration["taints"] = _taints(cluster.all_taints)  # [] means none (kubeadm: no omitempty)
    if api.endswith("v1beta4"):
        registration["kubeletExtraArgs"] = [{"name": k, "value": v} for k, v in sorted(extra.items())]
    else:
        registration["kubeletExtraArgs"] = dict(sorted(extra.items()))
    bootstrap: dict[str, Any] = {"apiServerEndpoint": cluster.api_server, "token": token.value}
    if cluster.ca_cert_hashes:
        bootstrap["caCertHashes"] = list(cluster.ca_cert_hashes)
    if insecure_skip_ca_verification:
        bootstrap["unsafeSkipCAVerification"] = True
    discovery: dict[str, Any] = {"bootstrapToken": bootstrap, "tlsBootstrapToken": token.value}
    doc: dict[str, Any] = {
        "apiVersion": api,
        "kind": "JoinConfiguration",
        "discovery": discovery,
        "nodeRegistration": registration,
    }
    if api.endswith("v1beta3"):
        discovery["timeout"] = "5m0s"
    if with_patches:
        doc["patches"] = {"directory": PATCHES_DIR}
    if api.endswith("v1beta4"):
        doc["timeouts"] = {"discovery": "5m0s", "tlsBootstrap": "5m0s", "kubeletHealthCheck": "4m0s"}
    return doc


def kubelet_configuration(cluster: Cluster, args: SortedArgs, *, standalone: bool) -> dict[str, Any]:
    """KubeletConfiguration fields nodeprep owns. `standalone` (mode kubelet) adds what kubeadm
    otherwise provides: registerWithTaints, authentication/authorization, certificate rotation."""
    doc: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": cluster.cgroup_driver,
        "containerRuntimeEndpoint": cluster.cri_socket,
    }
    if standalone:
        doc.update(
            {
                "authentication": {
                    "anonymous": {"enabled": False},
                    "webhook": {"enabled": True},
                    "x509": {"clientCAFile": cluster.ca_cert_file},
                },
                "authorization": {"mode": "Webhook"},
                "rotateCertificates": True,
                "registerNode": True,
                "registerWithTaints": _taints(cluster.all_taints),
            }
        )
    _deep_merge(doc, args.config)
    return doc


def _deep_merge(into: dict[str, Any], new: Mapping[str, Any]) -> None:
    for k, v in new.items():
        if isinstance(v, Mapping) and isinstance(into.get(k), dict):
            _deep_merge(into[k], v)
        else:
            into[k] = v


def kubelet_patch(cluster: Cluster, args: SortedArgs) -> dict[str, Any]:
    """The kubeadm `kubeletconfiguration` merge patch (no apiVersion/kind: a JSON merge patch)."""
    doc = kubelet_configuration(cluster, args, standalone=False)
    doc.pop("apiVersion")
    doc.pop("kind")
    return doc


def bootstrap_kubeconfig(cluster: Cluster, token: BootstrapToken, *, insecure: bool) -> dict[str, Any]:
    server = cluster.api_server if "://" in cluster.api_server else f"https://{cluster.api_server}"
    cluster_entry: dict[str, Any] = {"server": server}
    if insecure:
        cluster_entry["insecure-skip-tls-verify"] = True
    else:
        cluster_entry["certificate-authority"] = cluster.ca_cert_file
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "default", "cluster": cluster_entry}],
        "users": [{"name": "kubelet-bootstrap", "user": {"token": token.value}}],
        "contexts": [{"name": "default", "context": {"cluster": "default", "user": "kubelet-bootstrap"}}],
        "current-context": "default",
    }


def _systemd_word(arg: str) -> str:
    """One ExecStart word, quoted for systemd (specifiers % and variables $ escaped)."""
    if "\n" in arg:
        raise ValueError("newline in a kubelet argument")
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"'


def kubelet_drop_in(cluster: Cluster, labels: Mapping[str, str], args: SortedArgs) -> str:
    argv = [
        f"--bootstrap-kubeconfig={BOOTSTRAP_KUBECONFIG}",
        f"--kubeconfig={KUBECONFIG}",
        f"--config={KUBELET_CONFIG}",
        f"--cert-dir={PKI_DIR}",
    ]
    if cluster.node_name:
        argv.append(f"--hostname-override={cluster.node_name}")
    if labels:
        argv.append(f"--node-labels={node_labels_arg(labels)}")
    argv += [f"--{k}={v}" for k, v in sorted(args.flags.items())]
    words = " \\\n    ".join(_systemd_word(a) for a in argv)
    return (
        "# Written by nodeprep join (mode kubelet); rewritten on the next join.\n"
        "[Unit]\nWants=containerd.service\nAfter=containerd.service\n\n"
        "[Service]\nExecStart=\n"
        f"ExecStart={KUBELET_BIN} \\\n    {words}\n"
    )
