"""The node profile: every field's error message, unknown keys, the published JSON Schema, the
annotated example, and a JSON round trip."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from nodeprep import profile
from nodeprep.errors import ProfileError
from nodeprep.profile.fields import field_by_path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "node.yaml"

MINIMAL: dict[str, Any] = {"driver": {"version": "535.309.01"}}
PIN = "sha256:" + "ab" * 32


def _problems(data: Any) -> list[str]:
    with pytest.raises(ProfileError) as exc:
        profile.parse_profile(data, "test.yaml")
    assert exc.value.exit_code == 2
    assert str(exc.value).startswith("test.yaml: ")
    return exc.value.problems


def _with(section: str, key: str, value: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(MINIMAL))
    if section == "cluster":
        data["cluster"] = {"api_server": "10.0.0.10:6443", "ca_cert_hashes": [PIN]}
    data.setdefault(section, {})[key] = value
    return data


def test_minimal_profile_gets_defaults() -> None:
    p = profile.parse_profile(MINIMAL, "m.yaml")
    assert p.driver.version == "535.309.01"
    assert p.driver.flavour == "proprietary"
    assert p.driver.modules == ("nvidia", "nvidia-uvm", "nvidia-modeset")
    assert p.labels.cloud == "auto" and p.labels.extra == {}
    assert p.cluster is None
    assert p.runtime.containerd_config == "/etc/containerd/config.toml"
    assert p.runtime.cdi is True and p.runtime.default_runtime is False


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        pytest.param(
            "driver",
            "version",
            "535",
            "driver.version: '535' is not a full driver version (expected e.g. 550.90.07)",
            id="version-short",
        ),
        pytest.param(
            "driver",
            "version",
            550.9,
            "driver.version: 550.9 must be a quoted string (YAML read it as a number)",
            id="version-number",
        ),
        pytest.param(
            "driver",
            "flavour",
            "opn",
            "driver.flavour: 'opn' is not one of proprietary, open (did you mean 'open'?)",
            id="flavour",
        ),
        pytest.param(
            "driver",
            "store",
            "relative/dir",
            "driver.store: 'relative/dir' must be an absolute directory, an http(s):// or file:// URL, or "
            "oci://HOST[:PORT]/REPO",
            id="store",
        ),
        pytest.param(
            "driver",
            "store",
            "oci://registry.example/Drivers",
            "driver.store: 'oci://registry.example/Drivers': 'Drivers' is not a repository name (lowercase "
            "letters, digits, separators . _ - and /)",
            id="store-oci",
        ),
        pytest.param(
            "driver",
            "registry_auth",
            "config.json",
            "driver.registry_auth: 'config.json' must be an absolute path",
            id="registry-auth",
        ),
        pytest.param(
            "driver", "ca_file", "ca.pem", "driver.ca_file: 'ca.pem' must be an absolute path", id="ca-file"
        ),
        pytest.param(
            "driver", "insecure_http", "yes", "driver.insecure_http: expected true or false, got 'yes'",
            id="insecure-http",
        ),
        pytest.param(
            "driver", "keep_boot_kernel", "on", "driver.keep_boot_kernel: expected true or false, got 'on'",
            id="keep-boot-kernel",
        ),
        pytest.param(
            "driver",
            "kernel",
            "linux",
            "driver.kernel: 'linux' is not a kernel release (e.g. 6.1.0-28-amd64)",
            id="kernel",
        ),
        pytest.param(
            "driver",
            "modules",
            ["nvidia-uvm"],
            "driver.modules: must include 'nvidia' (the other modules depend on it)",
            id="modules-no-nvidia",
        ),
        pytest.param(
            "driver",
            "modules",
            ["nvidia", "nvidia-foo"],
            "driver.modules[1]: 'nvidia-foo' is not one of "
            "nvidia, nvidia-uvm, nvidia-modeset, nvidia-drm, nvidia-peermem, nvidia-fs, gdrdrv "
            "(did you mean 'nvidia-fs'?)",
            id="modules-unknown",
        ),
        pytest.param(
            "driver",
            "gpudirect",
            ["gdrcopy"],
            "driver.gpudirect[0]: 'gdrcopy' is not one of nvidia-peermem, nvidia-fs, gdrdrv",
            id="gpudirect-unknown",
        ),
        pytest.param(
            "driver", "modules", "nvidia", "driver.modules: expected a list, got string", id="modules-type"
        ),
        pytest.param(
            "labels",
            "extra",
            {"kubernetes.io/a/b": "x"},
            "labels.extra: key 'kubernetes.io/a/b' has more than one '/'",
            id="labels-key",
        ),
        pytest.param("labels", "extra", {"example.com/a": "-bad-"}, None, id="labels-value"),
        pytest.param(
            "labels", "extra", ["a=b"], "labels.extra: expected a mapping, got list", id="labels-type"
        ),
        pytest.param(
            "labels",
            "cloud",
            "gcp",
            "labels.cloud: 'gcp' is not one of auto, aws, gce, azure, none (did you mean 'gce'?)",
            id="cloud",
        ),
        pytest.param(
            "cluster",
            "mode",
            "kubectl",
            "cluster.mode: 'kubectl' is not one of kubeadm, kubelet (did you mean 'kubelet'?)",
            id="mode",
        ),
        pytest.param(
            "cluster",
            "api_server",
            "10.0.0.10",
            "cluster.api_server: '10.0.0.10' must be host:port (e.g. 10.0.0.10:6443)",
            id="api-server-port",
        ),
        pytest.param(
            "cluster",
            "api_server",
            "10.0.0.10:99999",
            "cluster.api_server: '10.0.0.10:99999': port '99999' is not a number between 1 and 65535",
            id="api-server-range",
        ),
        pytest.param(
            "cluster",
            "api_server",
            "Bad_Host:6443",
            "cluster.api_server: 'Bad_Host:6443': 'Bad_Host' "
            "is not a host name or IP address (IPv6 goes in brackets)",
            id="api-server-host",
        ),
        pytest.param(
            "cluster",
            "token_file",
            "token",
            "cluster.token_file: 'token' must be an absolute path",
            id="token-file",
        ),
        pytest.param(
            "cluster",
            "ca_cert_hashes",
            ["sha256:abc"],
            "cluster.ca_cert_hashes[0]: 'sha256:abc' is not sha256:<64 hex digits>",
            id="ca-hash",
        ),
        pytest.param(
            "cluster",
            "ca_cert_file",
            "ca.crt",
            "cluster.ca_cert_file: 'ca.crt' must be an absolute path",
            id="ca-file",
        ),
        pytest.param(
            "cluster",
            "kubernetes_version",
            "1.x",
            "cluster.kubernetes_version: '1.x' is not a Kubernetes version (e.g. 1.31 or v1.31.2)",
            id="k8s-version",
        ),
        pytest.param(
            "cluster",
            "kubernetes_version",
            "1.20",
            "cluster.kubernetes_version: '1.20' is older than the oldest supported Kubernetes 1.27",
            id="k8s-too-old",
        ),
        pytest.param(
            "cluster",
            "node_name",
            "GPU_1",
            "cluster.node_name: 'GPU_1' is not a valid node name (lower-case DNS subdomain, e.g. gpu-node-1)",
            id="node-name",
        ),
        pytest.param(
            "cluster",
            "taints",
            ["dedicated"],
            "cluster.taints[0]: 'dedicated' must be key=value:Effect or key:Effect",
            id="taint-string",
        ),
        pytest.param(
            "cluster",
            "taints",
            [{"key": "a", "effect": "Never"}],
            "cluster.taints[0]: taint effect 'Never' is not one of NoSchedule, PreferNoSchedule, NoExecute",
            id="taint-effect",
        ),
        pytest.param(
            "cluster",
            "taints",
            [{"key": "a", "effect": "NoSchedule", "operator": "Exists"}],
            "cluster.taints[0]: unknown taint field(s) operator (allowed: key, value, effect)",
            id="taint-field",
        ),
        pytest.param(
            "cluster",
            "gpu_taint",
            "yes",
            "cluster.gpu_taint: expected true or false, got 'yes'",
            id="gpu-taint",
        ),
        pytest.param(
            "cluster",
            "verify_gpus",
            "no",
            "cluster.verify_gpus: expected true or false, got 'no'",
            id="verify-gpus",
        ),
        pytest.param(
            "driver",
            "persistence_mode",
            "on",
            "driver.persistence_mode: 'on' is not one of any, enabled, disabled",
            id="persistence-mode",
        ),
        pytest.param(
            "driver",
            "persistenced",
            "no",
            "driver.persistenced: expected true or false, got 'no'",
            id="persistenced-type",
        ),
        pytest.param(  # YAML's `off` is false, not a mode
            "driver",
            "fabricmanager",
            False,
            "driver.fabricmanager: False is not one of auto, always, never",
            id="fabricmanager-mode",
        ),
        pytest.param(
            "driver",
            "fabric_timeout",
            7200,
            "driver.fabric_timeout: 7200 is not from 0 to 3600",
            id="fabric-timeout",
        ),
        pytest.param(
            "driver",
            "fabric_timeout",
            "2m",
            "driver.fabric_timeout: expected a whole number, got string",
            id="fabric-timeout-string",
        ),
        pytest.param(
            "cluster",
            "cri_socket",
            "/run/containerd/containerd.sock",
            "cluster.cri_socket: '/run/containerd/containerd.sock' must be a unix:// endpoint",
            id="cri-socket",
        ),
        pytest.param(
            "cluster",
            "cgroup_driver",
            "system",
            "cluster.cgroup_driver: 'system' is not one of systemd, cgroupfs (did you mean 'systemd'?)",
            id="cgroup-driver",
        ),
        pytest.param(
            "cluster",
            "kubelet_extra_args",
            {"--max-pods": "10"},
            "cluster.kubelet_extra_args: "
            "'--max-pods': write flag names without leading dashes (e.g. max-pods)",
            id="extra-args-dashes",
        ),
        pytest.param(
            "cluster",
            "kubelet_extra_args",
            {"read-only-port": True},
            "cluster.kubelet_extra_args: "
            "'read-only-port': write 'true' in quotes (kubelet flags take strings)",
            id="extra-args-bool",
        ),
        pytest.param("cluster", "feature_gates", {"featureX": "on"}, None, id="feature-gates"),
        pytest.param("driver", "branch", 580, "driver.branch: 580 must be a quoted string (YAML read it as a "
                     "number)", id="branch-number"),
        pytest.param("driver", "branch", "580.95",
                     "driver.branch: '580.95' is not a driver branch (its major number, e.g. 580)",
                     id="branch"),
        pytest.param("driver", "gpus", "10de:2335 10de:2901",
                     "driver.gpus: '10de:2335 10de:2901' is not 'node' or a comma list of NVIDIA PCI ids "
                     "(10de:DEVICE[:SUBVENDOR:SUBDEVICE])", id="gpus"),
        pytest.param("driver", "branch_policy", "latest", "driver.branch_policy: 'latest' is not one of "
                     "newest, oldest (did you mean 'oldest'?)", id="branch-policy"),
        pytest.param(
            "runtime",
            "containerd_config",
            "config.toml",
            "runtime.containerd_config: 'config.toml' must be an absolute path",
            id="containerd-config",
        ),
        pytest.param(
            "runtime",
            "nvidia_runtime",
            1,
            "runtime.nvidia_runtime: expected true or false, got 1",
            id="nvidia-runtime",
        ),
        pytest.param(
            "runtime",
            "nvidia_runtime_path",
            "nvidia-container-runtime",
            "runtime.nvidia_runtime_path: 'nvidia-container-runtime' must be an absolute path",
            id="nvidia-runtime-path",
        ),
        pytest.param("runtime", "cdi", "true", "runtime.cdi: expected true or false, got 'true'", id="cdi"),
        pytest.param(
            "runtime",
            "cdi_spec_dirs",
            ["cdi"],
            "runtime.cdi_spec_dirs[0]: 'cdi' must be an absolute path",
            id="cdi-dirs",
        ),
        pytest.param(
            "runtime",
            "default_runtime",
            None,
            "runtime.default_runtime: expected true or false, got None",
            id="default-runtime",
        ),
        pytest.param(
            "runtime",
            "cdi_hook_path",
            "nvidia-cdi-hook",
            "runtime.cdi_hook_path: 'nvidia-cdi-hook' must be an absolute path",
            id="cdi-hook-path",
        ),
        pytest.param(
            "labels",
            "mig_strategy",
            "singel",
            "labels.mig_strategy: 'singel' is not one of none, single, mixed (did you mean 'single'?)",
            id="mig-strategy",
        ),
        pytest.param(
            "mig",
            "config",
            {"version": "v2", "mig-configs": {"a": [{"devices": "all", "mig-enabled": False}]}},
            "mig.config: version: 'v2' is not 'v1' (mig-parted's format)",
            id="mig-config",
        ),
        pytest.param(
            "mig",
            "select",
            "no such",
            "mig.select: 'no such' is not a config name (a label value)",
            id="mig-select",
        ),
        pytest.param("health", "enabled", "yes", None, id="health-enabled"),
        pytest.param("health", "hold", -1, None, id="health-hold"),
    ],
)
def test_every_field_reports_its_path(section: str, key: str, value: Any, message: str | None) -> None:
    problems = _problems(_with(section, key, value))
    assert len(problems) >= 1
    if message is not None:
        assert message in problems
    else:
        assert all(p.startswith(f"{section}.{key}") for p in problems)


def _wrong_type(f: Any) -> Any:
    """A value of the wrong JSON type for field `f`, by its rule's schema."""
    kind = f.schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if "array" in kinds or "object" in kinds:
        return 5
    if "boolean" in kinds or "integer" in kinds:
        return "x"
    return [1]  # strings, enums, nullable strings


@pytest.mark.parametrize("path", [f.path for f in profile.FIELDS])
def test_every_field_refuses_a_value_of_the_wrong_type(path: str) -> None:
    """Derived from the field table (a new field is covered without a line here): a value of the
    wrong type is refused naming the field's path; the exact messages are the cases above."""
    f = field_by_path(path)
    problems = _problems(_with(f.section, f.key, _wrong_type(f)))
    assert problems and all(p.startswith(f.path) for p in problems), problems


def test_every_problem_is_collected_with_did_you_mean() -> None:
    data = {
        "drivr": {},
        "driver": {"version": "535", "flavor": "open"},
        "cluster": {"apiserver": "x", "gpu_taint": "no"},
    }
    problems = _problems(data)
    assert "drivr: unknown section (did you mean 'driver'?)" in problems
    assert "driver.flavor: unknown key (did you mean 'flavour'?)" in problems
    assert "cluster.apiserver: unknown key (did you mean 'api_server'?)" in problems
    assert "cluster.api_server: required" in problems
    assert any(p.startswith("driver.version: ") for p in problems)
    assert any(p.startswith("cluster.gpu_taint: ") for p in problems)
    assert any(p.startswith("cluster.ca_cert_hashes: required in mode kubeadm") for p in problems)
    assert len(problems) == 7


def test_unknown_key_without_close_match_lists_allowed() -> None:
    problems = _problems({"driver": {"version": "535.309.01", "zzz": 1}})
    allowed = ", ".join(f.key for f in profile.FIELDS if f.section == "driver")  # the table's order
    assert problems == [f"driver.zzz: unknown key (allowed: {allowed})"]


def test_missing_driver_and_bad_top_level() -> None:
    assert _problems({}) == ["driver: required section is missing"]
    assert _problems(["a"]) == ["top level must be a mapping, got list"]
    assert _problems({"driver": "535"}) == ["driver: expected a mapping, got string"]


def test_cross_field_rules() -> None:
    data = _with("runtime", "nvidia_runtime", False)
    data["runtime"]["default_runtime"] = True
    assert _problems(data) == ["runtime.default_runtime: needs nvidia_runtime: true"]
    data = _with("cluster", "gpu_taint", True)
    data["cluster"]["taints"] = ["nvidia.com/gpu=yes:NoSchedule"]
    assert _problems(data) == [
        "cluster.taints: conflicts with gpu_taint (nvidia.com/gpu taint with another value)"
    ]


def test_taints_forms_and_gpu_taint() -> None:
    data = _with(
        "cluster", "taints", ["a=b:NoSchedule", "c:NoExecute", {"key": "d", "effect": "PreferNoSchedule"}]
    )
    data["cluster"]["gpu_taint"] = True
    c = profile.parse_profile(data).cluster
    assert c is not None
    assert [str(t) for t in c.all_taints] == [
        "a=b:NoSchedule",
        "c:NoExecute",
        "d:PreferNoSchedule",
        "nvidia.com/gpu=present:NoSchedule",
        "nodeprep.dev/unverified:NoSchedule",  # verify_gpus (default true)
    ]
    assert c.minor == (1, 31)
    data["cluster"]["verify_gpus"] = False
    c = profile.parse_profile(data).cluster
    assert c is not None and "nodeprep.dev/unverified:NoSchedule" not in [str(t) for t in c.all_taints]


def test_load_profile_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="file not found"):
        profile.load_profile(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("driver:\n  version: [\n")
    with pytest.raises(ProfileError) as exc:
        profile.load_profile(bad)
    assert str(exc.value).startswith(f"{bad}: ") and "not valid YAML" in str(exc.value)


def test_example_is_valid_against_schema_and_loads() -> None:
    schema = json.loads(profile.SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    data = yaml.safe_load(EXAMPLE.read_text())
    jsonschema.Draft202012Validator(schema).validate(data)
    p = profile.load_profile(EXAMPLE)
    assert p.driver.version == "535.309.01"
    assert p.cluster is not None and p.cluster.mode == "kubeadm"
    assert "nvidia.com/gpu=present:NoSchedule" in [str(t) for t in p.cluster.all_taints]
    assert p.labels.extra["example.com/team"] == "ml-platform"


def test_example_comments_every_field() -> None:
    """Every field in the example has a comment line right above it (it is the annotated reference)."""
    lines = EXAMPLE.read_text().splitlines()
    for f in profile.FIELDS:
        idx = [i for i, line in enumerate(lines) if line.strip().startswith(f"{f.key}:")]
        assert idx, f"{f.path} missing from examples/node.yaml"
        assert lines[idx[0] - 1].strip().startswith("#"), f"{f.path} has no comment in examples/node.yaml"


def test_schema_file_matches_the_field_table() -> None:
    """The published schema is generated from FIELDS; regenerate it with `nodeprep profile schema >
    nodeprep/data/profile.schema.json`."""
    assert profile.SCHEMA_PATH.read_text() == profile.render_schema()


def test_schema_rejects_what_the_parser_rejects() -> None:
    schema = json.loads(profile.SCHEMA_PATH.read_text())
    v = jsonschema.Draft202012Validator(schema)
    for bad in (
        _with("driver", "flavour", "opn"),
        _with("driver", "zzz", 1),
        _with("cluster", "gpu_taint", "x"),
        _with("driver", "version", "535"),
    ):
        assert list(v.iter_errors(bad)), bad
        with pytest.raises(ProfileError):
            profile.parse_profile(bad)


def test_json_round_trip() -> None:
    p = profile.load_profile(EXAMPLE)
    text = p.to_json()
    again = profile.parse_profile(json.loads(text), "roundtrip.json")
    assert again == p
    assert again.to_json() == text
    jsonschema.Draft202012Validator(json.loads(profile.SCHEMA_PATH.read_text())).validate(json.loads(text))


def test_overrides_are_validated() -> None:
    p = profile.load_profile(EXAMPLE)
    q = profile.with_overrides(p, {"driver.version": "550.90.07", "driver.flavour": None})
    assert q.driver.version == "550.90.07" and q.driver.flavour == p.driver.flavour
    with pytest.raises(ProfileError, match=r"driver\.version: '55' is not a full driver version"):
        profile.with_overrides(p, {"driver.version": "55"})


def test_profile_path_defaults_under_root(tmp_path: Path) -> None:
    assert profile.profile_path(tmp_path, None) == tmp_path / "etc/nodeprep/node.yaml"
    assert profile.profile_path(tmp_path, Path("/x.yaml")) == Path("/x.yaml")


def test_override_options_come_from_the_table() -> None:
    import click
    from click.testing import CliRunner

    from nodeprep.commands.clioptions import override_options, pop_overrides

    @click.command()
    @override_options("driver.version", "cluster.api_server")
    def cmd(**kwargs: str | None) -> None:
        p = profile.with_overrides(profile.load_profile(EXAMPLE), pop_overrides(kwargs))
        assert kwargs == {}
        click.echo(f"{p.driver.version} {p.cluster.api_server if p.cluster else ''}")

    r = CliRunner().invoke(cmd, ["--driver", "550.90.07", "--api-server", "[fd00::1]:6443"])
    assert r.exit_code == 0 and r.output == "550.90.07 [fd00::1]:6443\n"
    assert profile.with_overrides(profile.load_profile(EXAMPLE), {"driver.version": None}).source == str(
        EXAMPLE
    )


def test_docs_list_every_field() -> None:
    text = (REPO / "docs" / "profile.md").read_text()
    missing = [f.path for f in profile.FIELDS if f"| `{f.path}` |" not in text]
    assert missing == []


def test_field_table_covers_the_model_exactly() -> None:
    """to_dict() walks the sections' dataclass fields and the parser walks FIELDS: the two name the
    same keys."""
    from dataclasses import fields

    for name, cls in profile.SECTIONS.items():
        table = sorted(f.key for f in profile.FIELDS if f.section == name)
        assert sorted(f.name for f in fields(cls)) == table, name


def test_kubelet_extra_args_are_checked_by_type() -> None:
    """Typical GPU-node args pass; values that would become a second flag in kubeadm-flags.env, an
    out-of-range config integer or a non-IP are refused by the profile itself (issue 25)."""
    good = {"node-ip": "10.0.0.5,fd00::5", "max-pods": 110, "provider-id": "aws:///eu-west-1a/i-0abc",
            "eviction-hard": "memory.available<100Mi", "cluster-dns": "10.96.0.10", "v": "2",
            "root-dir": "/var/lib/kubelet", "pod-max-pids": "-1"}
    c = profile.parse_profile(_with("cluster", "kubelet_extra_args", good)).cluster
    assert c is not None and c.kubelet_extra_args["max-pods"] == "110"
    bad = {
        "node-ip": ("10.0.0.1 --authorization-mode=AlwaysAllow", "is not an IP address"),
        "provider-id": ("aws:///x --anonymous-auth=true", "holds ' '"),
        "cloud-provider": ("external\n--x=y", "holds a control character"),
        "max-pods": (int("1" * 56), "is not an integer from 0 to 2147483647"),
        "read-only-port": ("70000", "is not an integer from 0 to 65535"),
        "cluster-dns": ("kube-dns", "is not an IP address"),
        "client-ca-file": ("/etc/../ca.crt", "is not an absolute path without '..'"),
        "hostname-override": ("n1", "set by nodeprep from the profile; use cluster.node_name"),
    }
    for flag, (value, message) in bad.items():
        problems = _problems(_with("cluster", "kubelet_extra_args", {flag: value}))
        assert len(problems) == 1, problems
        assert problems[0].startswith(f"cluster.kubelet_extra_args: {flag}: "), problems
        assert message in problems[0], problems


def test_removed_flags_and_gates_follow_the_profile_version() -> None:
    data = _with("cluster", "kubelet_extra_args", {"keep-terminated-pod-volumes": "true"})
    data["cluster"]["kubernetes_version"] = "1.30"
    assert profile.parse_profile(data).cluster is not None
    data["cluster"]["kubernetes_version"] = "1.31"
    data["cluster"]["feature_gates"] = {"DevicePlugins": True}
    assert _problems(data) == [
        "cluster.kubelet_extra_args.keep-terminated-pod-volumes: --keep-terminated-pod-volumes was removed "
        "in Kubernetes 1.31 (cluster is 1.31); remove it",
        "cluster.feature_gates: feature gate DevicePlugins was removed in Kubernetes 1.28 (cluster is 1.31); "
        "device plugins are always on (GA in 1.26); drop the gate",
    ]


def test_ca_pins_are_required_in_kubeadm_mode_unless_the_join_skips_verification() -> None:
    data = _with("cluster", "ca_cert_hashes", [])
    assert _problems(data)[0].startswith("cluster.ca_cert_hashes: required in mode kubeadm")
    assert profile.parse_profile(data, insecure_skip_ca_verification=True).cluster is not None
    data["cluster"]["mode"] = "kubelet"  # pins are kubeadm's discovery; kubelet mode uses ca_cert_file
    assert profile.parse_profile(data).cluster is not None


@pytest.mark.parametrize(("store", "insecure", "ok"), [
    ("http://127.0.0.1:8080/store", False, True),
    ("http://[::1]/store", False, True),
    ("http://localhost/store", False, True),
    ("oci+http://127.0.0.1:5000/nvidia/drivers", False, True),
    ("https://store.example.com/nvidia", False, True),
    ("oci://registry.example.com/nvidia/drivers", False, True),
    ("http://10.0.0.5/store", True, True),
    ("oci+http://10.0.0.5:5000/nvidia/drivers", True, True),
    ("http://10.0.0.5/store", False, False),
    ("http://store.example.com/store", False, False),
    ("oci+http://registry.example.com/nvidia/drivers", False, False),
])
def test_driver_store_transport_rule(store: str, insecure: bool, ok: bool) -> None:
    """The profile applies --store's transport rule (nodeprep.urls.plain_http_allowed) to
    driver.store, with driver.insecure_http as the opt-out: profile check and cloud-init refuse
    what install would, naming the field (issue #25)."""
    data = {"driver": {"version": "535.309.01", "store": store, "insecure_http": insecure}}
    if ok:
        assert profile.parse_profile(data).driver.store == store
    else:
        problems = _problems(data)
        assert len(problems) == 1 and problems[0].startswith("driver.store: ")
        assert "driver.insecure_http" in problems[0]
