"""The checks behind the profile's fields that are more than a shape: paths, store references, API
server endpoints, Kubernetes versions and names, taints, labels, kubelet flags, kernel modules. Each
is either a `check(str) -> message | None` for rules.string, or a Rule of its own."""

from __future__ import annotations

import ipaddress
import re
from collections import Counter
from typing import Any
from urllib.parse import urlsplit

from .. import kubeletflags, labelrules
from ..errors import InputError
from ..urls import has_userinfo, parse_store_location, plain_http_allowed
from ..vocab import KERNEL_MODULES
from .model import DNS1123_SUBDOMAIN_RE, FLAG_NAME_RE, K8S_VERSION_RE, OLDEST_KUBERNETES, TAINT_EFFECTS, Taint
from .rules import Problem, Problems, Rule, enum, list_of, name_of, show, string, type_name

_MODULE_LIST = list_of(enum(*KERNEL_MODULES))


def abs_path(value: str) -> str | None:
    """A path on the node: absolute, no `..` component, no NUL, newline or other control character
    (it becomes a file nodeprep writes or a line in a configuration file)."""
    if not value.isprintable():
        return f"{show(value)} holds a control character (NUL, newline, ...)"
    if not value.startswith("/"):
        return f"{show(value)} must be an absolute path"
    if ".." in value.split("/"):
        return f"{show(value)} must not contain '..'"
    return None


def cri_socket(value: str) -> str | None:
    """A CRI endpoint: unix:// and an absolute socket path (abs_path's rules)."""
    problem = abs_path(value.removeprefix("unix://"))
    return f"{show(value)}: socket path {problem.split(' ', 1)[-1]}" if problem else None


def store(value: str) -> str | None:
    if has_userinfo(value):
        return (f"{show(value)}: credentials in the URL are refused (they would end up in logs and "
                "output); give them in a credentials file (docs/profile.md)")
    scheme = value.lower()  # a URL's scheme is case-insensitive (RFC 3986), as --store reads it
    if scheme.startswith(("oci://", "oci+http://")):
        # lazy: labels --help, Ansible nodeprep_doctor, Ansible nodeprep_join and 6 more starts
        from ..stores.ref import parse_ref

        try:
            parse_ref(value, insecure_http=True, what="driver.store")
        except InputError as e:
            return str(e).split(": ", 1)[-1]
        return None
    if scheme.startswith(("/", "file://")):
        return abs_path(value[len("file://"):] if scheme.startswith("file://") else value)
    if scheme.startswith(("http://", "https://")):
        try:  # what --store refuses (host, port, characters parsers read differently); transport below
            parse_store_location(value, insecure_http=True, what="driver.store")
        except InputError as e:
            return str(e).split(": ", 1)[-1]
        return None
    return (f"{show(value)} must be an absolute directory, an http(s):// or file:// URL, or "
            f"oci://HOST[:PORT]/REPO")


def store_transport(value: Any, insecure_http: Any) -> str | None:
    """The transport rule (nodeprep.urls.plain_http_allowed) for a store that passed `store`: plain
    http (http://, oci+http://) off loopback needs driver.insecure_http, as --store needs
    --insecure-http, decided from the profile before anything connects."""
    if not isinstance(value, str) or store(value) is not None or insecure_http is True:
        return None
    if value.lower().startswith("http://"):
        host = urlsplit(value).hostname or ""
    elif value.lower().startswith("oci+http://"):
        # lazy: labels --help, Ansible nodeprep_doctor, Ansible nodeprep_join and 6 more starts
        from ..stores.ref import parse_ref

        host = parse_ref(value, insecure_http=True, what="driver.store").hostname
    else:
        return None
    if plain_http_allowed(host, insecure_http=False):
        return None
    return (f"{show(value)}: plain http to a store off loopback is refused (anyone on the path "
            "could swap the index and the artifacts); use https, or set driver.insecure_http: true")


def api_server(value: str) -> str | None:
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        return f"{show(value)} must be host:port (e.g. 10.0.0.10:6443)"
    if not port.isdigit() or not 0 < int(port) < 65536:
        return f"{show(value)}: port {show(port)} is not a number between 1 and 65535"
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return f"{show(value)}: {show(host)} is not an IPv6 address"
        return None
    if not (DNS1123_SUBDOMAIN_RE.fullmatch(host.lower()) and len(host) <= 253):
        return f"{show(value)}: {show(host)} is not a host name or IP address (IPv6 goes in brackets)"
    return None


def k8s_version(value: str) -> str | None:
    m = K8S_VERSION_RE.fullmatch(value)
    assert m
    if (int(m.group(1)), int(m.group(2))) < OLDEST_KUBERNETES:
        return (
            f"{show(value)} is older than the oldest supported Kubernetes "
            f"{OLDEST_KUBERNETES[0]}.{OLDEST_KUBERNETES[1]}"
        )
    return None


def node_name(value: str) -> str | None:
    if len(value) > 253 or not DNS1123_SUBDOMAIN_RE.fullmatch(value):
        return f"{show(value)} is not a valid node name (lower-case DNS subdomain, e.g. gpu-node-1)"
    return None


def _taint(value: Any) -> tuple[Any, Problems]:
    """A taint as `key=value:Effect`, `key:Effect` or a mapping {key, value, effect}."""
    if isinstance(value, str):
        body, sep, effect = value.rpartition(":")
        if not sep:
            return value, [f"{show(value)} must be key=value:Effect or key:Effect"]
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
        return value, [f"expected key=value:Effect or a mapping, got {type_name(value)}"]
    problems: list[str] = []
    if not isinstance(data["key"], str) or not data["key"]:
        problems.append("taint key is empty")
    else:
        problems += _label_key_problems(data["key"])
    if not isinstance(data["value"], str):
        problems.append(f"taint value {show(data['value'])} must be a string")
    elif data["value"]:
        problems += _label_value_problems(data["key"], data["value"])
    if data["effect"] not in TAINT_EFFECTS:
        problems.append(f"taint effect {show(data['effect'])} is not one of {', '.join(TAINT_EFFECTS)}")
    if problems:
        return value, problems
    return Taint(key=data["key"], value=data["value"], effect=data["effect"]), []


def _taints(value: Any) -> tuple[Any, Problems]:
    """The taint list; the same key and effect twice is refused (the API server rejects the Node)."""
    parsed, problems = list_of(taint)(value)
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


def label_pair(key: str, value: Any) -> list[str]:
    """A `labels.extra` entry: valid syntax, and one a kubelet may register with (join passes these
    as --node-labels / kubeletExtraArgs; NodeRestriction refuses the others)."""
    problems = _label_key_problems(key) + _label_value_problems(key, value)
    if not problems and (why := labelrules.why_not_self_settable(key)):
        problems.append(f"cannot be set by the kubelet at registration: {why}")
    return problems


def _label_value(value: Any) -> tuple[Any, Problems]:
    """A label value: a string. Numbers and booleans are refused, not coerced (quote them)."""
    if isinstance(value, bool | int | float):
        kind = type_name(value)
        return value, [f"{show(value)} must be a quoted string (YAML read it as "
                       f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}; labels are strings: put it in quotes)"]
    if not isinstance(value, str):
        return value, [f"expected a string, got {type_name(value)}"]
    return value, []


def flag_name(name: str) -> str | None:
    if name.startswith("-"):
        return f"{show(name)}: write flag names without leading dashes (e.g. max-pods)"
    if not FLAG_NAME_RE.fullmatch(name):
        return f"{show(name)} is not a kubelet flag name (lower-case letters, digits and '-')"
    return None


def kubelet_arg(name: str, value: Any) -> list[str]:
    """A `cluster.kubelet_extra_args` entry whatever the Kubernetes version: a flag nodeprep does
    not set itself, with a value of the flag's type (nodeprep.kubeletflags.flag_problem)."""
    problem = kubeletflags.flag_problem(name.lstrip("-"), value)
    return [f"{name_of(name)}: {problem}"] if problem else []


def feature_gate(name: str) -> str | None:
    return (
        None
        if re.fullmatch(r"[A-Z][A-Za-z0-9]*", name)
        else f"{show(name)} is not a feature gate name (e.g. DevicePluginCDIDevices)"
    )


def _scalar_str(value: Any) -> tuple[Any, Problems]:
    if isinstance(value, bool):
        return value, [f"write {str(value).lower()!r} in quotes (kubelet flags take strings)"]
    if isinstance(value, int | float):
        return str(value), []
    if not isinstance(value, str):
        return value, [f"expected a string, got {type_name(value)}"]
    return value, []


def _modules(value: Any) -> tuple[Any, Problems]:
    parsed, problems = _MODULE_LIST(value)
    if not problems:
        if "nvidia" not in parsed:
            problems.append("must include 'nvidia' (the other modules depend on it)")
        dupes = sorted(m for m, n in Counter(parsed).items() if n > 1)
        if dupes:
            problems.append(f"lists {', '.join(dupes)} more than once")
    return parsed, problems


# Rules with checks of their own; their schemas say the same shapes.
modules = Rule(_modules, {**_MODULE_LIST.schema, "uniqueItems": True, "contains": {"const": "nvidia"}})
taint = Rule(_taint, {
    "oneOf": [
        {"type": "string", "pattern": rf"^[^:]+(=[^:]*)?:({'|'.join(TAINT_EFFECTS)})$"},
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["key", "effect"],
            "properties": {"key": string().schema, "value": string().schema,
                           "effect": enum(*TAINT_EFFECTS).schema},
        },
    ]
})
taints = Rule(_taints, list_of(taint).schema)
label_value = Rule(_label_value, string().schema)
# kubelet flag values: strings; numbers are taken as written (the schema asks for the string)
scalar_str = Rule(_scalar_str, string().schema)
