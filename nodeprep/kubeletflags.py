"""Kubelet flags by Kubernetes minor version: which extra args stay flags, which move into
KubeletConfiguration, which are refused.

Data, not logic (docs/join.md "Kubelet flags"). Sources:
- deprecated-in-favour-of-the-config-file flags: the kubelet reference page
  (kubernetes/website content/en/docs/reference/command-line-tools-reference/kubelet.md, "DEPRECATED:
  This parameter should be set via the config file specified by the Kubelet's --config flag");
  config field names from k8s.io/kubelet config/v1beta1/types.go;
- removed flags: kubernetes CHANGELOG-1.2x, as collected per release by siderolabs/go-kubernetes
  (kubernetes/upgrade/checks.go) and the PRs cited beside each entry;
- seed-era GPU support: kubernetes PR #24836 (--experimental-nvidia-gpus, v1.3), PR #42116
  (Accelerators gate, v1.6), PR #57384/#61498 (deprecated 1.10, removed 1.11).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import InputError

OLDEST = (1, 27)
NEWEST = (1, 35)  # newest minor this table has been checked against
INT32_MAX = 2**31 - 1
# What a flag value that stays on the command line may not hold: kubeadm writes kubeletExtraArgs
# into kubeadm-flags.env as KUBELET_KUBEADM_ARGS="--a=b --c=d", which systemd splits into words at
# whitespace, so a space would start a second kubelet flag; quotes, backslashes and `$` would
# change how that line is read.
UNSAFE_IN_FLAG = frozenset(" \t\"'\\$`")


def _printable(v: str) -> str:
    if not v.isprintable():
        raise ValueError(f"{v[:80]!r} holds a control character (newline, tab, ...)")
    return v


def _str(v: str) -> str:
    return _printable(v)


def _int_in(low: int, high: int) -> Callable[[str], int]:
    """An integer from `low` to `high` (a 56-digit number is not a pod limit)."""

    def convert(v: str) -> int:
        text = v.strip()
        digits = text[1:] if text[:1] in "+-" else text
        if not (digits.isascii() and digits.isdigit()) or len(digits) > 10 or not low <= int(text) <= high:
            raise ValueError(f"{v[:80]!r} is not an integer from {low} to {high}")
        return int(text)

    return convert


_int = _int_in(0, INT32_MAX)
_port = _int_in(0, 65535)
_percent = _int_in(0, 100)


def _bool(v: str) -> bool:
    low = v.strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise ValueError(f"{v[:80]!r} is not true or false")


def _ip(v: str) -> str:
    try:
        return str(ipaddress.ip_address(v))
    except ValueError:
        raise ValueError(f"{v[:80]!r} is not an IP address") from None


def _ips(v: str) -> list[str]:
    """Comma-separated IP addresses (an IPv4 and an IPv6 for a dual-stack node)."""
    items = v.split(",")
    if not 1 <= len(items) <= 2:
        raise ValueError(f"{v[:80]!r} is not one IP address or an IPv4,IPv6 pair")
    return [_ip(x) for x in items]


def _path(v: str) -> str:
    """An absolute path without `..` (what the kubelet reads or writes on the node)."""
    _printable(v)
    if not v.startswith("/") or ".." in v.split("/"):
        raise ValueError(f"{v[:80]!r} is not an absolute path without '..'")
    return v


def _path_or_empty(v: str) -> str:
    return v if v == "" else _path(v)


def _list(v: str) -> list[str]:
    return [x.strip() for x in _printable(v).split(",") if x.strip()]


def _ip_list(v: str) -> list[str]:
    return [_ip(x) for x in _list(v)]


def _map(v: str, sep: str = "=") -> dict[str, str]:
    out = {}
    for item in _list(v):
        k, s, val = item.partition(sep)
        if not s:
            raise ValueError(f"{item[:80]!r} is not key{sep}value")
        out[k.strip()] = val.strip()
    return out


def _eviction(v: str) -> dict[str, str]:
    return _map(v, "<")


def _gates(v: str) -> dict[str, bool]:
    return {k: _bool(val) for k, val in _map(v).items()}


def _taints(v: str) -> list[dict[str, str]]:
    out = []
    for item in _list(v):
        body, _, effect = item.rpartition(":")
        key, _, value = body.partition("=")
        taint = {"key": key, "effect": effect}
        if value:
            taint["value"] = value
        out.append(taint)
    return out


def _flag_word(v: str) -> str:
    """A value that stays a kubelet flag: one word in kubeadm-flags.env and the systemd drop-in."""
    _printable(v)
    bad = sorted(set(v) & UNSAFE_IN_FLAG)
    if bad:
        shown = ", ".join(repr(c) for c in bad)
        raise ValueError(f"{v[:80]!r} holds {shown}: a kubelet flag value is one word "
                         "(kubeadm-flags.env is split at whitespace into separate flags)")
    return v


@dataclass(frozen=True)
class ConfigField:
    """Where a deprecated flag lives in KubeletConfiguration: dotted path + value converter."""

    path: str
    convert: Callable[[str], Any] = _str


# Flag (without dashes) -> KubeletConfiguration field. All are deprecated as flags in every version
# this table covers (1.27+); nodeprep always moves them into the config file.
CONFIG_FIELDS: dict[str, ConfigField] = {
    "address": ConfigField("address", _ip),
    "anonymous-auth": ConfigField("authentication.anonymous.enabled", _bool),
    "authentication-token-webhook": ConfigField("authentication.webhook.enabled", _bool),
    "authorization-mode": ConfigField("authorization.mode"),
    "cgroup-driver": ConfigField("cgroupDriver"),
    "cgroup-root": ConfigField("cgroupRoot"),
    "cgroups-per-qos": ConfigField("cgroupsPerQOS", _bool),
    "client-ca-file": ConfigField("authentication.x509.clientCAFile", _path),
    "cluster-dns": ConfigField("clusterDNS", _ip_list),
    "cluster-domain": ConfigField("clusterDomain"),
    "container-log-max-files": ConfigField("containerLogMaxFiles", _int),
    "container-log-max-size": ConfigField("containerLogMaxSize"),
    "container-runtime-endpoint": ConfigField("containerRuntimeEndpoint"),
    "cpu-cfs-quota": ConfigField("cpuCFSQuota", _bool),
    "cpu-manager-policy": ConfigField("cpuManagerPolicy"),
    "enforce-node-allocatable": ConfigField("enforceNodeAllocatable", _list),
    "event-qps": ConfigField("eventRecordQPS", _int),
    "eviction-hard": ConfigField("evictionHard", _eviction),
    "eviction-soft": ConfigField("evictionSoft", _eviction),
    "fail-swap-on": ConfigField("failSwapOn", _bool),
    "feature-gates": ConfigField("featureGates", _gates),
    "hairpin-mode": ConfigField("hairpinMode"),
    "healthz-port": ConfigField("healthzPort", _port),
    "image-gc-high-threshold": ConfigField("imageGCHighThresholdPercent", _percent),
    "image-gc-low-threshold": ConfigField("imageGCLowThresholdPercent", _percent),
    "image-service-endpoint": ConfigField("imageServiceEndpoint"),
    "kube-api-burst": ConfigField("kubeAPIBurst", _int),
    "kube-api-qps": ConfigField("kubeAPIQPS", _int),
    "kube-reserved": ConfigField("kubeReserved", _map),
    "kubelet-cgroups": ConfigField("kubeletCgroups"),
    "max-open-files": ConfigField("maxOpenFiles", _int),
    "max-pods": ConfigField("maxPods", _int),
    "memory-manager-policy": ConfigField("memoryManagerPolicy"),
    "pod-manifest-path": ConfigField("staticPodPath", _path),
    "pod-max-pids": ConfigField("podPidsLimit", _int_in(-1, INT32_MAX)),
    "pods-per-core": ConfigField("podsPerCore", _int),
    "port": ConfigField("port", _port),
    "protect-kernel-defaults": ConfigField("protectKernelDefaults", _bool),
    "read-only-port": ConfigField("readOnlyPort", _port),
    "register-node": ConfigField("registerNode", _bool),
    "register-with-taints": ConfigField("registerWithTaints", _taints),
    "reserved-cpus": ConfigField("reservedSystemCPUs"),
    "resolv-conf": ConfigField("resolvConf", _path_or_empty),
    "rotate-certificates": ConfigField("rotateCertificates", _bool),
    "runtime-request-timeout": ConfigField("runtimeRequestTimeout"),
    "seccomp-default": ConfigField("seccompDefault", _bool),
    "serialize-image-pulls": ConfigField("serializeImagePulls", _bool),
    "system-cgroups": ConfigField("systemCgroups"),
    "system-reserved": ConfigField("systemReserved", _map),
    "tls-cert-file": ConfigField("tlsCertFile", _path),
    "tls-private-key-file": ConfigField("tlsPrivateKeyFile", _path),
    "topology-manager-policy": ConfigField("topologyManagerPolicy"),
    "topology-manager-scope": ConfigField("topologyManagerScope"),
    "volume-plugin-dir": ConfigField("volumePluginDir", _path),
}

# Flags that stay flags, by the type of their value; any other flag's value is one word (_flag_word).
FLAG_VALUES: dict[str, Callable[[str], Any]] = {
    "node-ip": _ips,
    "v": _int_in(0, 10),
    "root-dir": _path,
    "cert-dir": _path,
    "image-credential-provider-config": _path,
    "image-credential-provider-bin-dir": _path,
    "seccomp-profile-root": _path,
}

# Flags nodeprep sets from the profile itself -> the profile field to use instead.
OWNED: dict[str, str] = {
    "node-labels": "labels.extra",
    "register-with-taints": "cluster.taints / cluster.gpu_taint",
    "bootstrap-kubeconfig": "cluster.token_file",
    "kubeconfig": "nothing (nodeprep sets it)",
    "config": "nothing (nodeprep sets it)",
    "hostname-override": "cluster.node_name",
    "container-runtime-endpoint": "cluster.cri_socket",
    "cgroup-driver": "cluster.cgroup_driver",
}

# Flag -> (minor it was removed in, what to do instead).
REMOVED: dict[str, tuple[tuple[int, int], str]] = {
    # dockershim removal (1.24)
    "network-plugin": ((1, 24), "configure CNI in the container runtime"),
    "cni-bin-dir": ((1, 24), "configure CNI in the container runtime (containerd: plugins CRI cni.bin_dir)"),
    "cni-conf-dir": (
        (1, 24),
        "configure CNI in the container runtime (containerd: plugins CRI cni.conf_dir)",
    ),
    "cni-cache-dir": ((1, 24), "configure CNI in the container runtime"),
    "docker-endpoint": ((1, 24), "use containerd and cluster.cri_socket"),
    "image-pull-progress-deadline": ((1, 24), "configure the container runtime"),
    "experimental-dockershim-root-directory": ((1, 24), "use containerd"),
    "network-plugin-mtu": ((1, 24), "configure the CNI plugin"),
    # 1.27 (kubernetes PR #114017 and CHANGELOG-1.27)
    "container-runtime": ((1, 27), "remove it; only remote runtimes exist (cluster.cri_socket)"),
    "master-service-namespace": ((1, 27), "remove it"),
    # 1.30: in-tree credential providers (kubernetes PR #122595; deprecated by PR #118596)
    "azure-container-registry-config": (
        (1, 30),
        "use --image-credential-provider-config with the ACR credential provider plugin",
    ),
    # 1.31 (PR #122082, #122363)
    "keep-terminated-pod-volumes": ((1, 31), "remove it"),
    "iptables-masquerade-bit": ((1, 31), "remove it (kube-proxy owns these rules)"),
    "iptables-drop-bit": ((1, 31), "remove it (kube-proxy owns these rules)"),
    # 1.34 (PR #130161)
    "cloud-config": ((1, 34), "use an external cloud controller manager (--cloud-provider=external)"),
    # 1.35 (PR #133779; deprecated in 1.24 by PR #108045)
    "pod-infra-container-image": ((1, 35), "set the sandbox (pause) image in containerd's configuration"),
}

# Kubelet feature gates relevant to GPU nodes that were removed (kubelet refuses unknown gates).
REMOVED_GATES: dict[str, tuple[tuple[int, int], str]] = {
    "Accelerators": ((1, 11), "use the NVIDIA device plugin (resource nvidia.com/gpu) or CDI"),
    "DevicePlugins": ((1, 28), "device plugins are always on (GA in 1.26); drop the gate"),
    "KubeletPodResources": ((1, 30), "always on; drop the gate"),
    "KubeletPodResourcesGetAllocatable": ((1, 30), "always on; drop the gate"),
    "CPUManager": ((1, 33), "always on; drop the gate"),
    "DisableCloudProviders": ((1, 33), "in-tree cloud providers are gone; drop the gate"),
    "DisableKubeletCloudCredentialProviders": ((1, 33), "drop the gate"),
    "DevicePluginCDIDevices": (
        (1, 34),
        "CDI devices from device plugins are always on (GA 1.31); drop the gate",
    ),
}

# Pre-device-plugin GPU support: refused with the modern equivalent.
SEED_ERA_GPU = {
    "experimental-nvidia-gpus": "--experimental-nvidia-gpus (Kubernetes 1.3-1.5, resource "
    "alpha.kubernetes.io/nvidia-gpu) was replaced by the Accelerators gate in 1.6 "
    "and removed in 1.11",
}
MODERN_GPU = (
    "run the NVIDIA device plugin (resource nvidia.com/gpu) — nodeprep registers the nvidia "
    "runtime and writes the CDI spec /etc/cdi/nvidia.yaml for it; request GPUs with "
    "resources.limits: {nvidia.com/gpu: 1}"
)


def _v(minor: tuple[int, int]) -> str:
    return f"{minor[0]}.{minor[1]}"


@dataclass(frozen=True)
class SortedArgs:
    flags: dict[str, str]  # stay on the command line (kubeletExtraArgs / drop-in)
    config: dict[str, Any]  # nested KubeletConfiguration fragment
    moved: tuple[str, ...]  # flags that were moved into the config (for the report)


def _set_path(config: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = config
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    if isinstance(value, dict) and isinstance(node.get(parts[-1]), dict):
        node[parts[-1]].update(value)
    else:
        node[parts[-1]] = value


def flag_problem(flag: str, value: str) -> str | None:
    """What is wrong with extra arg `flag: value` in any Kubernetes version (None: nothing): a
    seed-era GPU flag or resource, a flag nodeprep sets itself, or a value not of the flag's type.
    The message does not name the flag."""
    if flag in SEED_ERA_GPU:
        return f"{SEED_ERA_GPU[flag]}; instead {MODERN_GPU}"
    if flag in OWNED:
        return f"set by nodeprep from the profile; use {OWNED[flag]}"
    if "alpha.kubernetes.io/nvidia-gpu" in value:
        return f"alpha.kubernetes.io/nvidia-gpu is the Kubernetes 1.3-1.10 GPU resource; instead {MODERN_GPU}"
    convert = CONFIG_FIELDS[flag].convert if flag in CONFIG_FIELDS else FLAG_VALUES.get(flag, _flag_word)
    try:
        convert(value)
        if flag not in CONFIG_FIELDS:
            _flag_word(value)
    except ValueError as e:
        return str(e)
    return None


def version_problems(
    args: Mapping[str, str], minor: tuple[int, int], feature_gates: Mapping[str, bool] | None = None
) -> list[str]:
    """Extra args and feature gates that Kubernetes `minor` no longer has, each naming its field."""
    problems = []
    for name in args:
        flag = name.lstrip("-")
        if flag in REMOVED and minor >= REMOVED[flag][0]:
            removed, instead = REMOVED[flag]
            problems.append(
                f"cluster.kubelet_extra_args.{flag}: --{flag} was removed in Kubernetes {_v(removed)} "
                f"(cluster is {_v(minor)}); {instead}"
            )
        elif flag == "feature-gates" and flag not in SEED_ERA_GPU:
            try:
                gates = _gates(args[name])
            except ValueError:
                continue  # flag_problem says so
            problems += _gate_problems(gates, minor, f"cluster.kubelet_extra_args.{flag}")
    return problems + _gate_problems(dict(feature_gates or {}), minor, "cluster.feature_gates")


def sort_args(
    args: Mapping[str, str], minor: tuple[int, int], *, feature_gates: Mapping[str, bool] | None = None
) -> SortedArgs:
    """Split kubelet extra args for Kubernetes `minor`: move deprecated ones into
    KubeletConfiguration. What the profile's validation refuses (flag_problem, version_problems)
    raises one InputError listing all, for callers that built a Profile by hand."""
    problems = [f"cluster.kubelet_extra_args.{name.lstrip('-')}: {p}" for name, value in args.items()
                if (p := flag_problem(name.lstrip("-"), value))]
    problems += version_problems(args, minor, feature_gates)
    if problems:
        raise InputError("; ".join(problems))
    flags: dict[str, str] = {}
    config: dict[str, Any] = {}
    moved: list[str] = []
    for name, value in args.items():
        flag = name.lstrip("-")
        if flag in CONFIG_FIELDS:
            field = CONFIG_FIELDS[flag]
            _set_path(config, field.path, field.convert(value))
            moved.append(flag)
        else:
            flags[flag] = value
    if feature_gates:
        _set_path(config, "featureGates", dict(feature_gates))
    return SortedArgs(flags, config, tuple(moved))


def _gate_problems(gates: Mapping[str, bool], minor: tuple[int, int], where: str) -> list[str]:
    problems = []
    for gate in gates:
        if gate in REMOVED_GATES and minor >= REMOVED_GATES[gate][0]:
            removed, instead = REMOVED_GATES[gate]
            extra = f"; instead {MODERN_GPU}" if gate == "Accelerators" else f"; {instead}"
            problems.append(
                f"{where}: feature gate {gate} was removed in Kubernetes {_v(removed)} "
                f"(cluster is {_v(minor)}){extra}"
            )
    return problems


def check_version(minor: tuple[int, int]) -> list[str]:
    """Warnings for versions outside the table."""
    if minor > NEWEST:
        return [
            f"Kubernetes {_v(minor)} is newer than the kubelet flag table ({_v(NEWEST)}); flags removed "
            "since then are not caught here"
        ]
    return []
