"""The node profile: one YAML file describing a node's wanted state (docs/profile.md).

Every field is declared once in FIELDS (YAML path, kind, default, help, optional command-line flag).
The parser, the JSON Schema (nodeprep/data/profile.schema.json), `to_dict()` and the command-line
overrides all come from that table. Parsing collects every problem as `field.path: message` and
raises one ProfileError listing them all (exit 2); unknown keys are reported with a did-you-mean.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
import reprlib
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from . import labelrules
from .errors import ProfileError
from .urls import has_userinfo, redact_url
from .vocab import DEFAULT_FLAVOUR, DEFAULT_MODULES, FLAVOURS, KERNEL_MODULES
from .yamlinput import Document, load_yaml

DEFAULT_PATH = Path("/etc/nodeprep/node.yaml")
SCHEMA_PATH = Path(__file__).parent / "data" / "profile.schema.json"

DRIVER_VERSION_RE = re.compile(r"^\d{3}\.\d{2,3}(\.\d{2})?$")
KERNEL_RE = re.compile(r"^\d+\.\d+[A-Za-z0-9.+_~-]*$")
K8S_VERSION_RE = re.compile(r"^v?(1)\.(\d{1,2})(?:\.(\d{1,3}))?$")
CA_HASH_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
DNS1123_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
FLAG_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
OLDEST_KUBERNETES = (1, 27)
MAX_PROBLEMS = 20  # listed in one error line; the rest are counted


# ---------------------------------------------------------------------------------------------
# The profile (immutable user input)


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str
    value: str = ""

    def to_dict(self) -> dict[str, str]:
        out = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        return out

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


GPU_TAINT = Taint("nvidia.com/gpu", "NoSchedule", "present")
UNVERIFIED_TAINT = Taint("nodeprep.dev/unverified", "NoSchedule")


@dataclass(frozen=True)
class Driver:
    version: str
    flavour: str = DEFAULT_FLAVOUR
    store: str | None = None
    kernel: str | None = None
    modules: tuple[str, ...] = DEFAULT_MODULES
    registry_auth: str | None = None
    ca_file: str | None = None
    insecure_http: bool = False
    persistence_mode: str = "any"  # the GPU self-test's expectation: enabled, disabled or any
    keep_boot_kernel: bool = False  # kernel hook: keep booting a kernel that has the driver


@dataclass(frozen=True)
class Labels:
    extra: dict[str, str] = field(default_factory=dict)
    cloud: str = "auto"


@dataclass(frozen=True)
class Cluster:
    api_server: str
    mode: str = "kubeadm"
    token_file: str = "/etc/nodeprep/bootstrap-token"
    ca_cert_hashes: tuple[str, ...] = ()
    ca_cert_file: str = "/etc/kubernetes/pki/ca.crt"
    kubernetes_version: str = "1.31"
    node_name: str | None = None
    taints: tuple[Taint, ...] = ()
    gpu_taint: bool = False
    verify_gpus: bool = True
    cri_socket: str = "unix:///run/containerd/containerd.sock"
    cgroup_driver: str = "systemd"
    kubelet_extra_args: dict[str, str] = field(default_factory=dict)
    feature_gates: dict[str, bool] = field(default_factory=dict)

    @property
    def minor(self) -> tuple[int, int]:
        """(major, minor) of kubernetes_version, e.g. (1, 31)."""
        m = K8S_VERSION_RE.match(self.kubernetes_version)
        assert m, self.kubernetes_version
        return int(m.group(1)), int(m.group(2))

    @property
    def all_taints(self) -> tuple[Taint, ...]:
        """Taints to register with: `taints`, plus nvidia.com/gpu=present:NoSchedule when gpu_taint, plus
        nodeprep.dev/unverified:NoSchedule when verify_gpus (lifted by `nodeprep verify-nodes` once the
        node's GPU self-test passed)."""
        taints = self.taints
        if self.gpu_taint and not any(
            t.key == GPU_TAINT.key and t.effect == GPU_TAINT.effect for t in self.taints
        ):
            taints = (*taints, GPU_TAINT)
        if self.verify_gpus and not any(t.key == UNVERIFIED_TAINT.key for t in taints):
            taints = (*taints, UNVERIFIED_TAINT)
        return taints


@dataclass(frozen=True)
class Runtime:
    containerd_config: str = "/etc/containerd/config.toml"
    nvidia_runtime: bool = True
    nvidia_runtime_path: str = "/usr/bin/nvidia-container-runtime"
    cdi: bool = True
    cdi_spec_dirs: tuple[str, ...] = ("/etc/cdi", "/var/run/cdi")
    default_runtime: bool = False


@dataclass(frozen=True)
class Profile:
    driver: Driver
    labels: Labels = field(default_factory=Labels)
    cluster: Cluster | None = None
    runtime: Runtime = field(default_factory=Runtime)
    source: str = field(default="profile", compare=False)

    def to_dict(self) -> dict[str, Any]:
        """Every field, defaults filled in, as plain JSON-able data (parse_profile reads it back)."""
        out: dict[str, Any] = {}
        for name in SECTIONS:
            section = getattr(self, name)
            if section is None:
                continue
            out[name] = {f.key: _to_plain(getattr(section, f.key)) for f in FIELDS if f.section == name}
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"


def _to_plain(value: Any) -> Any:
    if isinstance(value, Taint):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    return value


# ---------------------------------------------------------------------------------------------
# Field table: one row per field. `parse(value) -> (parsed, problems)`; problems are messages
# without the path (the parser prefixes `section.key: `).

class Problem(str):
    """A problem message that remembers where below its field it was found (`at`: map keys and
    list indexes), so the parser can name the line."""

    at: tuple[Any, ...] = ()

    @classmethod
    def under(cls, step: Any, text: str, inner: str) -> Problem:
        p = cls(text)
        p.at = (step, *getattr(inner, "at", ()))
        return p


Problems = list[str]
Parser = Callable[[Any], tuple[Any, Problems]]

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxtuple = 2, 4, 4, 4


def _name(key: Any) -> str:
    """A mapping key as written when it is a short printable string, else a bounded repr."""
    return key if isinstance(key, str) and len(key) <= 80 and key.isprintable() else _show(key)


def _show(value: Any) -> str:
    """A bounded repr for messages (values may be huge or alias-shared structures); URLs redacted."""
    return redact_url(_REPR.repr(value))


@dataclass(frozen=True)
class Field:
    section: str
    key: str
    parse: Parser
    schema: dict[str, Any]
    help: str
    required: bool = False
    flag: str | None = None  # command-line option that overrides this field, e.g. "--driver-version"

    @property
    def path(self) -> str:
        return f"{self.section}.{self.key}"


def _type_name(value: Any) -> str:
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "list",
        dict: "mapping",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _str(
    pattern: re.Pattern[str] | None = None,
    expected: str = "",
    check: Callable[[str], str | None] | None = None,
    nullable: bool = False,
) -> Parser:
    def parse(value: Any) -> tuple[Any, Problems]:
        if value is None and nullable:
            return None, []
        if isinstance(value, int | float) and not isinstance(value, bool) and pattern is not None:
            return value, [f"{_show(value)} must be a quoted string (YAML read it as a number)"]
        if not isinstance(value, str):
            return value, [f"expected a string, got {_type_name(value)}"]
        if pattern is not None and not pattern.match(value):
            return value, [f"{_show(value)} {expected}"]
        if check is not None and (problem := check(value)):
            return value, [problem]
        return value, []

    return parse


def _enum(*choices: str) -> Parser:
    def parse(value: Any) -> tuple[Any, Problems]:
        if value not in choices:
            hint = difflib.get_close_matches(value[:80], choices, n=1) if isinstance(value, str) else []
            extra = f" (did you mean {hint[0]!r}?)" if hint else ""
            return value, [f"{_show(value)} is not one of {', '.join(choices)}{extra}"]
        return value, []

    return parse


def _bool(value: Any) -> tuple[Any, Problems]:
    if not isinstance(value, bool):
        return value, [f"expected true or false, got {_show(value)}"]
    return value, []


def _list(item: Parser) -> Parser:
    def parse(value: Any) -> tuple[Any, Problems]:
        if not isinstance(value, list | tuple):
            return value, [f"expected a list, got {_type_name(value)}"]
        out, problems = [], []
        for i, v in enumerate(value):
            parsed, errs = item(v)
            out.append(parsed)
            problems += [Problem.under(i, f"[{i}]: {e}", e) for e in errs]
        return tuple(out), problems

    return parse


def _map(
    value_parser: Parser,
    key_check: Callable[[str], str | None] | None = None,
    pair_check: Callable[[str, Any], list[str]] | None = None,
) -> Parser:
    def parse(value: Any) -> tuple[Any, Problems]:
        if value is None:
            return {}, []
        if not isinstance(value, dict):
            return value, [f"expected a mapping, got {_type_name(value)}"]
        out, problems = {}, []
        for k, v in value.items():
            if not isinstance(k, str):
                problems.append(Problem.under(k, f"key {_show(k)} must be a string", ""))
                continue
            if key_check is not None and (problem := key_check(k)):
                problems.append(Problem.under(k, problem, ""))
            parsed, errs = value_parser(v)
            problems += [Problem.under(k, f"{_show(k)}: {e}", e) for e in errs]
            if not errs and pair_check is not None:
                problems += [Problem.under(k, e, "") for e in pair_check(k, parsed)]
            out[k] = parsed
        return out, problems

    return parse


def _modules(value: Any) -> tuple[Any, Problems]:
    parsed, problems = _list(_enum(*KERNEL_MODULES))(value)
    if not problems:
        if "nvidia" not in parsed:
            problems.append("must include 'nvidia' (the other modules depend on it)")
        dupes = sorted(m for m, n in Counter(parsed).items() if n > 1)
        if dupes:
            problems.append(f"lists {', '.join(dupes)} more than once")
    return parsed, problems


def _abs_path(value: str) -> str | None:
    return None if value.startswith("/") else f"{_show(value)} must be an absolute path"


def _store(value: str) -> str | None:
    if has_userinfo(value):
        return (f"{_show(value)}: credentials in the URL are refused (they would end up in logs and "
                "output); give them in a credentials file (docs/profile.md)")
    if value.startswith(("oci://", "oci+http://")):
        from .errors import InputError
        from .stores.ref import parse_ref

        try:
            parse_ref(value, insecure_http=True, what="driver.store")
        except InputError as e:
            return str(e).split(": ", 1)[-1]
        return None
    if value.startswith(("http://", "https://", "file://")) or value.startswith("/"):
        return None
    return (f"{_show(value)} must be an absolute directory, an http(s):// or file:// URL, or "
            f"oci://HOST[:PORT]/REPO")


def _api_server(value: str) -> str | None:
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        return f"{_show(value)} must be host:port (e.g. 10.0.0.10:6443)"
    if not port.isdigit() or not 0 < int(port) < 65536:
        return f"{_show(value)}: port {_show(port)} is not a number between 1 and 65535"
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return f"{_show(value)}: {_show(host)} is not an IPv6 address"
        return None
    if not (DNS1123_SUBDOMAIN_RE.match(host.lower()) and len(host) <= 253):
        return f"{_show(value)}: {_show(host)} is not a host name or IP address (IPv6 goes in brackets)"
    return None


def _k8s_version(value: str) -> str | None:
    m = K8S_VERSION_RE.match(value)
    assert m
    if (int(m.group(1)), int(m.group(2))) < OLDEST_KUBERNETES:
        return (
            f"{_show(value)} is older than the oldest supported Kubernetes "
            f"{OLDEST_KUBERNETES[0]}.{OLDEST_KUBERNETES[1]}"
        )
    return None


def _node_name(value: str) -> str | None:
    if len(value) > 253 or not DNS1123_SUBDOMAIN_RE.match(value):
        return f"{_show(value)} is not a valid node name (lower-case DNS subdomain, e.g. gpu-node-1)"
    return None


def _taint(value: Any) -> tuple[Any, Problems]:
    """A taint as `key=value:Effect`, `key:Effect` or a mapping {key, value, effect}."""
    if isinstance(value, str):
        body, sep, effect = value.rpartition(":")
        if not sep:
            return value, [f"{_show(value)} must be key=value:Effect or key:Effect"]
        key, _, tval = body.partition("=")
        data: dict[str, Any] = {"key": key, "value": tval, "effect": effect}
    elif isinstance(value, dict):
        unknown = sorted(set(value) - {"key", "value", "effect"})
        if unknown:
            return value, [
                f"unknown taint field(s) {', '.join(map(str, unknown))} (allowed: key, value, effect)"
            ]
        data = {
            "key": value.get("key", ""),
            "value": value.get("value", ""),
            "effect": value.get("effect", ""),
        }
    else:
        return value, [f"expected key=value:Effect or a mapping, got {_type_name(value)}"]
    problems: list[str] = []
    if not isinstance(data["key"], str) or not data["key"]:
        problems.append("taint key is empty")
    else:
        problems += _label_key_problems(data["key"])
    if not isinstance(data["value"], str):
        problems.append(f"taint value {_show(data['value'])} must be a string")
    elif data["value"]:
        problems += _label_value_problems(data["key"], data["value"])
    if data["effect"] not in TAINT_EFFECTS:
        problems.append(f"taint effect {_show(data['effect'])} is not one of {', '.join(TAINT_EFFECTS)}")
    if problems:
        return value, problems
    return Taint(key=data["key"], value=data["value"], effect=data["effect"]), []


def _taints(value: Any) -> tuple[Any, Problems]:
    """The taint list; the same key and effect twice is refused (the API server rejects the Node)."""
    parsed, problems = _list(_taint)(value)
    if problems:
        return parsed, problems
    first: dict[tuple[str, str], int] = {}
    for i, t in enumerate(parsed):
        j = first.setdefault((t.key, t.effect), i)
        if j != i:
            problems.append(Problem.under(i, f"[{i}]: {t.key}:{t.effect} is already set by [{j}] "
                                             "(one taint per key and effect)", ""))
    return parsed, problems


def _label_key_problems(key: str) -> list[str]:
    return labelrules.validate_key(key)


def _label_value_problems(key: str, value: str) -> list[str]:
    return labelrules.validate_value(key, value)


def _label_pair(key: str, value: Any) -> list[str]:
    """A `labels.extra` entry: valid syntax, and one a kubelet may register with (join passes these
    as --node-labels / kubeletExtraArgs; NodeRestriction refuses the others)."""
    problems = _label_key_problems(key) + _label_value_problems(key, value)
    if not problems and (why := labelrules.why_not_self_settable(key)):
        problems.append(f"cannot be set by the kubelet at registration: {why}")
    return problems


def _label_value(value: Any) -> tuple[Any, Problems]:
    """A label value: a string. Numbers and booleans are refused, not coerced (quote them)."""
    if isinstance(value, bool | int | float):
        kind = _type_name(value)
        return value, [f"{_show(value)} must be a quoted string (YAML read it as "
                       f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}; labels are strings: put it in quotes)"]
    if not isinstance(value, str):
        return value, [f"expected a string, got {_type_name(value)}"]
    return value, []


def _flag_name(name: str) -> str | None:
    if name.startswith("-"):
        return f"{_show(name)}: write flag names without leading dashes (e.g. max-pods)"
    if not FLAG_NAME_RE.match(name):
        return f"{_show(name)} is not a kubelet flag name (lower-case letters, digits and '-')"
    return None


def _feature_gate(name: str) -> str | None:
    return (
        None
        if re.match(r"^[A-Z][A-Za-z0-9]*$", name)
        else f"{_show(name)} is not a feature gate name (e.g. DevicePluginCDIDevices)"
    )


def _scalar_str(value: Any) -> tuple[Any, Problems]:
    if isinstance(value, bool):
        return value, [f"write {str(value).lower()!r} in quotes (kubelet flags take strings)"]
    if isinstance(value, int | float):
        return str(value), []
    if not isinstance(value, str):
        return value, [f"expected a string, got {_type_name(value)}"]
    return value, []


_STR = {"type": "string"}
_STR_LIST = {"type": "array", "items": {"type": "string"}}
_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_BOOL = {"type": "boolean"}
_TAINT_SCHEMA = {
    "oneOf": [
        {"type": "string", "pattern": r"^[^:]+(=[^:]*)?:(NoSchedule|PreferNoSchedule|NoExecute)$"},
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["key", "effect"],
            "properties": {"key": _STR, "value": _STR, "effect": {"enum": list(TAINT_EFFECTS)}},
        },
    ]
}

FIELDS: tuple[Field, ...] = (
    # driver
    Field(
        "driver",
        "version",
        _str(DRIVER_VERSION_RE, "is not a full driver version (expected e.g. 550.90.07)"),
        {"type": "string", "pattern": DRIVER_VERSION_RE.pattern},
        "NVIDIA driver version to install, e.g. 535.309.01",
        required=True,
        flag="--driver-version",
    ),
    Field(
        "driver",
        "flavour",
        _enum(*FLAVOURS),
        {"enum": list(FLAVOURS)},
        "Kernel module flavour: proprietary or open (open GPU kernel modules, Turing and newer)",
        flag="--flavour",
    ),
    Field(
        "driver",
        "store",
        _str(check=_store, nullable=True),
        {"type": ["string", "null"]},
        "Artifact store: a directory, file:// or http(s):// base URL with index.json, or an OCI registry "
        "repository oci://HOST[:PORT]/REPO[@sha256:DIGEST]",
        flag="--store",
    ),
    Field(
        "driver",
        "registry_auth",
        _str(check=_abs_path, nullable=True),
        {"type": ["string", "null"]},
        "Docker-style config.json with the registry's credentials (mode 0600; never the credentials "
        "themselves in the profile)",
    ),
    Field(
        "driver",
        "ca_file",
        _str(check=_abs_path, nullable=True),
        {"type": ["string", "null"]},
        "CA bundle (PEM) for the store's TLS certificate (default: the system's CAs)",
    ),
    Field(
        "driver",
        "insecure_http",
        _bool,
        _BOOL,
        "Allow plain http (oci+http://) to a registry that is not on loopback",
    ),
    Field(
        "driver",
        "kernel",
        _str(KERNEL_RE, "is not a kernel release (e.g. 6.1.0-28-amd64)", nullable=True),
        {"type": ["string", "null"], "pattern": KERNEL_RE.pattern},
        "Kernel release to install modules for (default: the running kernel)",
        flag="--kernel",
    ),
    Field(
        "driver",
        "modules",
        _modules,
        {
            "type": "array",
            "items": {"enum": list(KERNEL_MODULES)},
            "uniqueItems": True,
            "contains": {"const": "nvidia"},
        },
        "Kernel modules to load, in order",
    ),
    Field(
        "driver",
        "persistence_mode",
        _enum("any", "enabled", "disabled"),
        {"enum": ["any", "enabled", "disabled"]},
        "GPU persistence mode the self-test (nodeprep verify-gpus) expects on every GPU",
    ),
    Field(
        "driver",
        "keep_boot_kernel",
        _bool,
        _BOOL,
        "When a kernel installed later has no modules in the store, the kernel hook keeps the boot "
        "default (GRUB) on a kernel that has them",
    ),
    # labels
    Field(
        "labels",
        "extra",
        _map(_label_value, pair_check=_label_pair),
        _STR_MAP,
        "Extra node labels (key: value), validated against Kubernetes label syntax",
    ),
    Field(
        "labels",
        "cloud",
        _enum("auto", "aws", "gce", "azure", "none"),
        {"enum": ["auto", "aws", "gce", "azure", "none"]},
        "Cloud to read instance facts from: auto (DMI first), aws, gce, azure or none",
        flag="--cloud",
    ),
    # cluster
    Field(
        "cluster",
        "mode",
        _enum("kubeadm", "kubelet"),
        {"enum": ["kubeadm", "kubelet"]},
        "kubeadm: `kubeadm join` with a JoinConfiguration; kubelet: bootstrap kubeconfig + systemd drop-in",
    ),
    Field(
        "cluster",
        "api_server",
        _str(check=_api_server),
        _STR,
        "API server endpoint host:port, e.g. 10.0.0.10:6443",
        required=True,
        flag="--api-server",
    ),
    Field(
        "cluster",
        "token_file",
        _str(check=_abs_path),
        _STR,
        "File holding the bootstrap token (mode 0600; never put the token itself in the profile)",
        flag="--token-file",
    ),
    Field(
        "cluster",
        "ca_cert_hashes",
        _list(_str(CA_HASH_RE, "is not sha256:<64 hex digits>")),
        {"type": "array", "items": {"type": "string", "pattern": CA_HASH_RE.pattern}},
        "Public key pins of the cluster CA (kubeadm token create --print-join-command shows them)",
    ),
    Field(
        "cluster",
        "ca_cert_file",
        _str(check=_abs_path),
        _STR,
        "Cluster CA certificate (PEM) for the kubelet bootstrap kubeconfig (mode kubelet)",
    ),
    Field(
        "cluster",
        "kubernetes_version",
        _str(K8S_VERSION_RE, "is not a Kubernetes version (e.g. 1.31 or v1.31.2)", check=_k8s_version),
        {"type": "string", "pattern": K8S_VERSION_RE.pattern},
        "Kubernetes version of the cluster: picks the kubeadm API (v1beta3 < 1.31 <= v1beta4) "
        "and kubelet flags",
        flag="--kubernetes-version",
    ),
    Field(
        "cluster",
        "node_name",
        _str(check=_node_name, nullable=True),
        {"type": ["string", "null"]},
        "Node name (default: the host name)",
        flag="--node-name",
    ),
    Field(
        "cluster",
        "taints",
        _taints,
        {"type": "array", "items": _TAINT_SCHEMA},
        "Taints set at registration (the only time a node may set its own taints)",
    ),
    Field("cluster", "gpu_taint", _bool, _BOOL, "Add nvidia.com/gpu=present:NoSchedule at registration"),
    Field(
        "cluster",
        "verify_gpus",
        _bool,
        _BOOL,
        "Register with nodeprep.dev/unverified:NoSchedule; nodeprep verify-nodes lifts it once the "
        "node's GPU self-test passed (docs/join.md)",
    ),
    Field(
        "cluster",
        "cri_socket",
        _str(re.compile(r"^(unix|npipe)://."), "must be a unix:// endpoint"),
        {"type": "string", "pattern": r"^(unix|npipe)://."},
        "CRI endpoint of the container runtime",
    ),
    Field(
        "cluster",
        "cgroup_driver",
        _enum("systemd", "cgroupfs"),
        {"enum": ["systemd", "cgroupfs"]},
        "Kubelet cgroup driver; must match containerd's SystemdCgroup",
    ),
    Field(
        "cluster",
        "kubelet_extra_args",
        _map(_scalar_str, key_check=_flag_name),
        _STR_MAP,
        "Extra kubelet flags (name without dashes: value); deprecated ones move into KubeletConfiguration",
    ),
    Field(
        "cluster",
        "feature_gates",
        _map(_bool, key_check=_feature_gate),
        {"type": "object", "additionalProperties": {"type": "boolean"}},
        "Kubelet feature gates",
    ),
    # runtime
    Field(
        "runtime", "containerd_config", _str(check=_abs_path), _STR, "containerd's main configuration file"
    ),
    Field(
        "runtime", "nvidia_runtime", _bool, _BOOL, "Register the `nvidia` runtime (nvidia-container-runtime)"
    ),
    Field(
        "runtime",
        "nvidia_runtime_path",
        _str(check=_abs_path),
        _STR,
        "Path of nvidia-container-runtime (NVIDIA Container Toolkit)",
    ),
    Field(
        "runtime", "cdi", _bool, _BOOL, "Write the CDI spec /etc/cdi/nvidia.yaml and enable CDI in containerd"
    ),
    Field(
        "runtime",
        "cdi_spec_dirs",
        _list(_str(check=_abs_path)),
        _STR_LIST,
        "Directories containerd reads CDI specs from",
    ),
    Field("runtime", "default_runtime", _bool, _BOOL, "Make `nvidia` containerd's default runtime"),
)

SECTIONS: dict[str, type] = {"driver": Driver, "labels": Labels, "cluster": Cluster, "runtime": Runtime}
REQUIRED_SECTIONS = ("driver",)
SECTION_HELP = {
    "driver": "Which driver to install and from where",
    "labels": "Node labels beyond the GPU facts",
    "cluster": "How to join Kubernetes (omit to skip joining)",
    "runtime": "Container runtime integration (containerd, CDI)",
}


def field_by_path(path: str) -> Field:
    for f in FIELDS:
        if f.path == path:
            return f
    raise KeyError(path)


# ---------------------------------------------------------------------------------------------
# Parsing


def _did_you_mean(key: str, options: list[str]) -> str:
    match = difflib.get_close_matches(key, options, n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else f" (allowed: {', '.join(options)})"


def _check_invariants(sections: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Rules across fields that the table cannot express."""
    problems: list[str] = []
    cluster = sections.get("cluster")
    if cluster:
        if cluster.get("gpu_taint") and any(
            isinstance(t, Taint) and t.key == GPU_TAINT.key and t.value != GPU_TAINT.value
            for t in cluster.get("taints", ())
        ):
            problems.append(
                "cluster.taints: conflicts with gpu_taint (nvidia.com/gpu taint with another value)"
            )
    runtime = sections.get("runtime")
    if runtime and runtime.get("default_runtime") and not runtime.get("nvidia_runtime", True):
        problems.append("runtime.default_runtime: needs nvidia_runtime: true")
    return problems


def parse_profile(data: Any, source: str = "profile", document: Document | None = None) -> Profile:
    """Build a Profile from parsed YAML/JSON data; raise ProfileError listing every problem (with
    its line when `document` is the parsed file)."""
    problems: list[str] = []

    def at(*path: Any) -> str:
        line = document.line(*path) if document is not None else None
        return f" (line {line})" if line else ""

    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ProfileError([f"top level must be a mapping, got {_type_name(data)}"], source=source)
    for key in data:
        if key not in SECTIONS:
            problems.append(
                f"{_name(key)}: unknown section{_did_you_mean(str(key)[:80], list(SECTIONS))}{at(key)}"
            )
    parsed: dict[str, dict[str, Any]] = {}
    for name in SECTIONS:
        raw = data.get(name)
        if raw is None:
            if name in REQUIRED_SECTIONS:
                problems.append(f"{name}: required section is missing")
            continue
        if not isinstance(raw, dict):
            problems.append(f"{name}: expected a mapping, got {_type_name(raw)}{at(name)}")
            continue
        table = [f for f in FIELDS if f.section == name]
        known = [f.key for f in table]
        for key in raw:
            if key not in known:
                problems.append(
                    f"{name}.{_name(key)}: unknown key{_did_you_mean(str(key)[:80], known)}{at(name, key)}"
                )
        values: dict[str, Any] = {}
        for f in table:
            if f.key not in raw:
                if f.required:
                    problems.append(f"{f.path}: required")
                continue
            value, errs = f.parse(raw[f.key])
            for e in errs[: MAX_PROBLEMS + 1]:
                where = at(name, f.key, *getattr(e, "at", ()))
                problems.append(f"{f.path}: {e}{where}" if not e.startswith("[") else f"{f.path}{e}{where}")
            if len(errs) > MAX_PROBLEMS + 1:
                problems.append(f"{f.path}: {len(errs) - MAX_PROBLEMS - 1} more problems")
            values[f.key] = value
        parsed[name] = values
    problems += _check_invariants(parsed)
    if problems:
        if len(problems) > MAX_PROBLEMS:
            problems = [*problems[:MAX_PROBLEMS], f"and {len(problems) - MAX_PROBLEMS} more problems"]
        raise ProfileError(
            problems, source=source, hint="see examples/node.yaml and docs/profile.md for every field"
        )
    built = {name: SECTIONS[name](**values) for name, values in parsed.items()}
    return Profile(source=source, **built)


def read_profile(path: Path) -> tuple[str, Document]:
    """The profile file's text and parsed YAML (size, encoding, nesting, duplicate keys checked:
    nodeprep.yamlinput); ProfileError naming the file otherwise."""
    try:
        return load_yaml(Path(path), error=ProfileError)
    except ProfileError as e:
        if e.problems == ["file not found"]:
            e.hint = f"write one (see examples/node.yaml) or pass --profile; default {DEFAULT_PATH}"
        raise


def load_profile(path: Path) -> Profile:
    """Read and validate the profile at `path` (ProfileError naming the file on any problem)."""
    _, document = read_profile(path)
    return parse_profile(document.data, str(path), document)


def profile_path(root: Path, profile: Path | None) -> Path:
    """The profile to use: --profile when given, else DEFAULT_PATH under --root."""
    if profile is not None:
        return profile
    return Path(root) / DEFAULT_PATH.relative_to("/")


def with_overrides(profile: Profile, overrides: Mapping[str, Any]) -> Profile:
    """A new Profile with `section.key` values replaced (command-line flags); None values are
    ignored. The result is validated like a file."""
    given = {path: value for path, value in overrides.items() if value is not None}
    if not given:
        return profile
    data = profile.to_dict()
    for path, value in given.items():
        f = field_by_path(path)
        data.setdefault(f.section, {})[f.key] = value
    return parse_profile(data, f"{profile.source} + command line")


def override_options(*paths: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """click decorator: one option per field path, from the table's `flag` (default None = not
    given). The command passes its kwargs through `pop_overrides()` and then `with_overrides()`."""
    import click

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        for path in reversed(paths):
            f = field_by_path(path)
            if f.flag is None:
                raise ValueError(f"{path} has no command-line flag in FIELDS")
            fn = click.option(
                f.flag,
                path.replace(".", "__"),
                default=None,
                metavar="VALUE",
                help=f"{f.help} (overrides {path})",
            )(fn)
        return fn

    return decorate


def pop_overrides(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Remove the override_options() values from a command's kwargs; return them by field path."""
    return {k.replace("__", "."): kwargs.pop(k) for k in list(kwargs) if "__" in k}


# ---------------------------------------------------------------------------------------------
# JSON Schema (published at nodeprep/data/profile.schema.json; a test keeps it in step)


def json_schema() -> dict[str, Any]:
    props: dict[str, Any] = {}
    for name, cls in SECTIONS.items():
        table = [f for f in FIELDS if f.section == name]
        section_props = {}
        for f in table:
            prop = dict(f.schema)
            prop["description"] = f.help
            default = _default_of(cls, f.key)
            if default is not _NO_DEFAULT:
                prop["default"] = _to_plain(default)
            section_props[f.key] = prop
        props[name] = {
            "type": "object",
            "description": SECTION_HELP[name],
            "additionalProperties": False,
            "required": [f.key for f in table if f.required],
            "properties": section_props,
        }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://nodeprep.invalid/schemas/profile.schema.json",
        "title": "nodeprep node profile",
        "description": "A node's wanted state: driver, labels, cluster join, runtime (docs/profile.md)",
        "type": "object",
        "additionalProperties": False,
        "required": list(REQUIRED_SECTIONS),
        "properties": props,
    }


_NO_DEFAULT = object()


def _default_of(cls: type, key: str) -> Any:
    for f in fields(cls):
        if f.name == key:
            if f.default is not MISSING:
                return f.default
            if f.default_factory is not MISSING:
                return f.default_factory()
    return _NO_DEFAULT


def render_schema() -> str:
    return json.dumps(json_schema(), indent=2) + "\n"
