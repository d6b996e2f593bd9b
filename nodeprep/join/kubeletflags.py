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

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InputError

OLDEST = (1, 27)
NEWEST = (1, 35)  # newest minor this table has been checked against


def _str(v: str) -> str:
    return v


def _int(v: str) -> int:
    return int(v)


def _bool(v: str) -> bool:
    low = v.strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise ValueError(f"{v!r} is not true or false")


def _list(v: str) -> list[str]:
    return [x.strip() for x in v.split(",") if x.strip()]


def _map(v: str, sep: str = "=") -> dict[str, str]:
    out = {}
    for item in _list(v):
        k, s, val = item.partition(sep)
        if not s:
            raise ValueError(f"{item!r} is not key{sep}value")
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


@dataclass(frozen=True)
class ConfigField:
    """Where a deprecated flag lives in KubeletConfiguration: dotted path + value converter."""

    path: str
    convert: Callable[[str], Any] = _str


# Flag (without dashes) -> KubeletConfiguration field. All are deprecated as flags in every version
# this table covers (1.27+); nodeprep always moves them into the config file.
CONFIG_FIELDS: dict[str, ConfigField] = {
    "address": ConfigField("address"),
    "anonymous-auth": ConfigField("authentication.anonymous.enabled", _bool),
    "authentication-token-webhook": ConfigField("authentication.webhook.enabled", _bool),
    "authorization-mode": ConfigField("authorization.mode"),
    "cgroup-driver": ConfigField("cgroupDriver"),
    "cgroup-root": ConfigField("cgroupRoot"),
    "cgroups-per-qos": ConfigField("cgroupsPerQOS", _bool),
    "client-ca-file": ConfigField("authentication.x509.clientCAFile"),
    "cluster-dns": ConfigField("clusterDNS", _list),
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
    "healthz-port": ConfigField("healthzPort", _int),
    "image-gc-high-threshold": ConfigField("imageGCHighThresholdPercent", _int),
    "image-gc-low-threshold": ConfigField("imageGCLowThresholdPercent", _int),
    "image-service-endpoint": ConfigField("imageServiceEndpoint"),
    "kube-api-burst": ConfigField("kubeAPIBurst", _int),
    "kube-api-qps": ConfigField("kubeAPIQPS", _int),
    "kube-reserved": ConfigField("kubeReserved", _map),
    "kubelet-cgroups": ConfigField("kubeletCgroups"),
    "max-open-files": ConfigField("maxOpenFiles", _int),
    "max-pods": ConfigField("maxPods", _int),
    "memory-manager-policy": ConfigField("memoryManagerPolicy"),
    "pod-manifest-path": ConfigField("staticPodPath"),
    "pod-max-pids": ConfigField("podPidsLimit", _int),
    "pods-per-core": ConfigField("podsPerCore", _int),
    "port": ConfigField("port", _int),
    "protect-kernel-defaults": ConfigField("protectKernelDefaults", _bool),
    "read-only-port": ConfigField("readOnlyPort", _int),
    "register-node": ConfigField("registerNode", _bool),
    "register-with-taints": ConfigField("registerWithTaints", _taints),
    "reserved-cpus": ConfigField("reservedSystemCPUs"),
    "resolv-conf": ConfigField("resolvConf"),
    "rotate-certificates": ConfigField("rotateCertificates", _bool),
    "runtime-request-timeout": ConfigField("runtimeRequestTimeout"),
    "seccomp-default": ConfigField("seccompDefault", _bool),
    "serialize-image-pulls": ConfigField("serializeImagePulls", _bool),
    "system-cgroups": ConfigField("systemCgroups"),
    "system-reserved": ConfigField("systemReserved", _map),
    "tls-cert-file": ConfigField("tlsCertFile"),
    "tls-private-key-file": ConfigField("tlsPrivateKeyFile"),
    "topology-manager-policy": ConfigField("topologyManagerPolicy"),
    "topology-manager-scope": ConfigField("topologyManagerScope"),
    "volume-plugin-dir": ConfigField("volumePluginDir"),
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


def sort_args(
    args: Mapping[str, str], minor: tuple[int, int], *, feature_gates: Mapping[str, bool] | None = None
) -> SortedArgs:
    """Split kubelet extra args for Kubernetes `minor`: refuse removed and seed-era flags (one
    InputError listing all), move deprecated ones into KubeletConfiguration."""
    problems: list[str] = []
    flags: dict[str, str] = {}
    config: dict[str, Any] = {}
    moved: list[str] = []
    for name, value in args.items():
        flag = name.lstrip("-")
        where = f"cluster.kubelet_extra_args.{flag}"
        if flag in SEED_ERA_GPU:
            problems.append(f"{where}: {SEED_ERA_GPU[flag]}; instead {MODERN_GPU}")
            continue
        if flag in REMOVED and minor >= REMOVED[flag][0]:
            removed, instead = REMOVED[flag]
            problems.append(
                f"{where}: --{flag} was removed in Kubernetes {_v(removed)} "
                f"(cluster is {_v(minor)}); {instead}"
            )
            continue
        if "alpha.kubernetes.io/nvidia-gpu" in value:
            problems.append(
                f"{where}: alpha.kubernetes.io/nvidia-gpu is the Kubernetes 1.3-1.10 GPU resource; "
                f"instead {MODERN_GPU}"
            )
            continue
        if flag in CONFIG_FIELDS:
            field = CONFIG_FIELDS[flag]
            try:
                converted = field.convert(value)
            except ValueError as e:
                problems.append(f"{where}: {e}")
                continue
            if flag == "feature-gates":
                problems += _gate_problems(converted, minor, where)
            _set_path(config, field.path, converted)
            moved.append(flag)
            continue
        flags[flag] = value
    feature_gates = dict(feature_gates or {})
    problems += _gate_problems(feature_gates, minor, "cluster.feature_gates")
    if problems:
        raise InputError("; ".join(problems))
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
