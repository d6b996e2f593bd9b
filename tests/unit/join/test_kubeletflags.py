"""The kubelet flag table: removed flags refused with the version, deprecated ones moved into
KubeletConfiguration, seed-era GPU flags refused with the modern equivalent."""

from __future__ import annotations

import pytest

from nodeprep.errors import InputError
from nodeprep.kubeletflags import CONFIG_FIELDS, REMOVED, check_version, sort_args


@pytest.mark.parametrize(
    ("flag", "ok_in", "removed_in"),
    [
        pytest.param("container-runtime", None, (1, 27), id="container-runtime"),
        pytest.param("azure-container-registry-config", (1, 29), (1, 30), id="acr"),
        pytest.param("keep-terminated-pod-volumes", (1, 30), (1, 31), id="keep-terminated"),
        pytest.param("iptables-masquerade-bit", (1, 30), (1, 31), id="iptables"),
        pytest.param("cloud-config", (1, 33), (1, 34), id="cloud-config"),
        pytest.param("pod-infra-container-image", (1, 34), (1, 35), id="pause-image"),
        pytest.param("network-plugin", None, (1, 28), id="dockershim"),
    ],
)
def test_removed_flags(flag: str, ok_in: tuple[int, int] | None, removed_in: tuple[int, int]) -> None:
    if ok_in is not None:
        assert sort_args({flag: "x"}, ok_in).flags == {flag: "x"}
    with pytest.raises(InputError) as exc:
        sort_args({flag: "x"}, removed_in)
    when = REMOVED[flag][0]
    assert (
        f"cluster.kubelet_extra_args.{flag}: --{flag} was removed in Kubernetes {when[0]}.{when[1]} "
        f"(cluster is {removed_in[0]}.{removed_in[1]})"
    ) in str(exc.value)


def test_every_minor_from_1_28_to_1_34_is_covered() -> None:
    """Each supported minor sorts a typical GPU node's args without surprises."""
    args = {
        "max-pods": "110",
        "node-ip": "10.0.0.5",
        "fail-swap-on": "false",
        "provider-id": "aws:///x",
        "kube-reserved": "cpu=100m,memory=1Gi",
        "feature-gates": "KubeletCgroupDriverFromCRI=true",
    }
    for minor in range(28, 35):
        s = sort_args(args, (1, minor))
        assert s.flags == {"node-ip": "10.0.0.5", "provider-id": "aws:///x"}
        assert s.config == {
            "maxPods": 110,
            "failSwapOn": False,
            "kubeReserved": {"cpu": "100m", "memory": "1Gi"},
            "featureGates": {"KubeletCgroupDriverFromCRI": True},
        }
        assert set(s.moved) == {"max-pods", "fail-swap-on", "kube-reserved", "feature-gates"}
        assert check_version((1, minor)) == []
    assert "newer than the kubelet flag table" in check_version((1, 36))[0]


def test_nested_config_paths_and_types() -> None:
    s = sort_args(
        {
            "anonymous-auth": "false",
            "authorization-mode": "Webhook",
            "client-ca-file": "/ca.crt",
            "cluster-dns": "10.96.0.10, 10.96.0.11",
            "kube-reserved": "cpu=100m,memory=1Gi",
            "eviction-hard": "memory.available<100Mi,nodefs.available<10%",
        },
        (1, 31),
    )
    assert s.config["authentication"] == {
        "anonymous": {"enabled": False},
        "x509": {"clientCAFile": "/ca.crt"},
    }
    assert s.config["authorization"] == {"mode": "Webhook"}
    assert s.config["clusterDNS"] == ["10.96.0.10", "10.96.0.11"]
    assert s.config["kubeReserved"] == {"cpu": "100m", "memory": "1Gi"}
    assert s.config["evictionHard"] == {"memory.available": "100Mi", "nodefs.available": "10%"}


def test_bad_values_are_collected() -> None:
    with pytest.raises(InputError) as exc:
        sort_args({"max-pods": "many", "fail-swap-on": "maybe", "container-runtime": "remote"}, (1, 31))
    text = str(exc.value)
    assert "cluster.kubelet_extra_args.max-pods: 'many' is not an integer from 0 to 2147483647" in text
    assert "cluster.kubelet_extra_args.fail-swap-on: 'maybe' is not true or false" in text
    assert "--container-runtime was removed in Kubernetes 1.27" in text


@pytest.mark.parametrize(
    ("args", "gates", "needle"),
    [
        pytest.param(
            {"experimental-nvidia-gpus": "1"}, {}, "--experimental-nvidia-gpus (Kubernetes 1.3-1.5", id="flag"
        ),
        pytest.param(
            {"feature-gates": "Accelerators=true"},
            {},
            "feature gate Accelerators was removed in Kubernetes 1.11",
            id="accelerators-flag",
        ),
        pytest.param(
            {},
            {"Accelerators": True},
            "cluster.feature_gates: feature gate Accelerators was removed",
            id="gate",
        ),
        pytest.param(
            {"system-reserved": "alpha.kubernetes.io/nvidia-gpu=1"},
            {},
            "alpha.kubernetes.io/nvidia-gpu is the Kubernetes 1.3-1.10 GPU resource",
            id="alpha-resource",
        ),
    ],
)
def test_seed_era_gpu_support_is_refused_with_the_modern_way(
    args: dict[str, str], gates: dict[str, bool], needle: str
) -> None:
    with pytest.raises(InputError) as exc:
        sort_args(args, (1, 31), feature_gates=gates)
    assert needle in str(exc.value)
    assert "NVIDIA device plugin (resource nvidia.com/gpu)" in str(exc.value)
    assert "CDI" in str(exc.value)


def test_removed_gates_by_version() -> None:
    assert sort_args({}, (1, 33), feature_gates={"DevicePluginCDIDevices": True}).config == {
        "featureGates": {"DevicePluginCDIDevices": True}
    }
    with pytest.raises(
        InputError, match="feature gate DevicePluginCDIDevices was removed in Kubernetes 1.34"
    ):
        sort_args({}, (1, 34), feature_gates={"DevicePluginCDIDevices": True})
    with pytest.raises(InputError, match="DevicePlugins was removed in Kubernetes 1.28"):
        sort_args({"feature-gates": "DevicePlugins=true"}, (1, 28))


def test_table_has_config_fields_for_the_deprecated_flags_named_in_the_reference() -> None:
    """The kubelet reference marks these DEPRECATED in favour of --config."""
    for flag in (
        "cgroup-driver",
        "container-runtime-endpoint",
        "register-node",
        "register-with-taints",
        "max-pods",
        "cluster-dns",
        "cluster-domain",
        "cpu-manager-policy",
        "authorization-mode",
        "anonymous-auth",
        "client-ca-file",
        "read-only-port",
        "pod-manifest-path",
        "protect-kernel-defaults",
        "memory-manager-policy",
        "reserved-cpus",
    ):
        assert flag in CONFIG_FIELDS
    for flag in ("node-labels", "node-ip", "provider-id", "bootstrap-kubeconfig", "cert-dir", "config"):
        assert flag not in CONFIG_FIELDS and flag not in REMOVED
