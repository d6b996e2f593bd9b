"""Kubernetes label rules, below both the profile and the labeler (no imports of either).

Syntax follows k8s.io/apimachinery (`IsQualifiedName`, `IsValidLabelValue`); what a node may set on
itself follows the kubelet's `IsKubeletLabel` and NodeRestriction admission (`getForbiddenLabels`).
`nodeprep.profile` uses these to refuse, in every command that reads a profile, the `labels.extra`
keys a kubelet may not register with; `nodeprep.labels.validate` adds the InputError-raising helpers.
"""

from __future__ import annotations

import re

NAME_MAX = 63
PREFIX_MAX = 253
VALUE_MAX = 63

_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_PREFIX_RE = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*$")
_SANITISE_RE = re.compile(r"[^A-Za-z0-9-_. ]")

# Exact keys a kubelet may set on its own Node (k8s.io/kubelet pkg/apis/well_known_labels.go).
KUBELET_LABELS = frozenset({
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
})
# Namespaces (and their subdomains) a kubelet may use freely.
KUBELET_NAMESPACES = ("kubelet.kubernetes.io", "node.kubernetes.io")
RESTRICTED_NAMESPACES = ("kubernetes.io", "k8s.io")
NODE_RESTRICTION_NAMESPACE = "node-restriction.kubernetes.io"


def sanitise(text: str) -> str:
    """GFD's sanitise(): drop all but [A-Za-z0-9-_. ], join whitespace-separated words with '-'."""
    return "-".join(_SANITISE_RE.sub("", text).split())


def validate_key(key: str) -> list[str]:
    """Problems with a label key ([] when valid)."""
    problems: list[str] = []
    if not key:
        return ["key is empty"]
    parts = key.split("/")
    if len(parts) > 2:
        return [f"key {key!r} has more than one '/'"]
    name = parts[-1]
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            problems.append(f"key {key!r}: prefix is empty")
        elif len(prefix) > PREFIX_MAX:
            problems.append(f"key {key!r}: prefix is longer than {PREFIX_MAX} characters")
        elif not _PREFIX_RE.fullmatch(prefix):
            problems.append(f"key {key!r}: prefix {prefix!r} is not a DNS subdomain "
                            "(lower-case alphanumerics, '-' and '.', alphanumeric at both ends)")
    if not name:
        problems.append(f"key {key!r}: name is empty")
    elif len(name) > NAME_MAX:
        problems.append(f"key {key!r}: name is longer than {NAME_MAX} characters")
    elif not _NAME_RE.fullmatch(name):
        problems.append(f"key {key!r}: name must consist of alphanumerics, '-', '_' or '.', "
                        "and start and end with an alphanumeric")
    return problems


def validate_value(key: str, value: str) -> list[str]:
    """Problems with a label value ([] when valid; empty is valid)."""
    if not isinstance(value, str):
        return [f"label {key!r}: value must be a string, got {type(value).__name__}"]
    if value == "":
        return []
    if len(value) > VALUE_MAX:
        return [f"label {key!r}: value is longer than {VALUE_MAX} characters ({len(value)})"]
    if not _NAME_RE.fullmatch(value):
        return [f"label {key!r}: value {value!r} must consist of alphanumerics, '-', '_' or '.', "
                "and start and end with an alphanumeric"]
    return []


def validate_label(key: str, value: str) -> list[str]:
    """All problems with one label, one line each ([] when the label is valid)."""
    return validate_key(key) + validate_value(key, value)


def _namespace(key: str) -> str:
    return key.split("/", 1)[0] if "/" in key else ""


def _in_namespace(ns: str, parent: str) -> bool:
    return ns == parent or ns.endswith("." + parent)


def is_kubelet_label(key: str) -> bool:
    """The kubelet's IsKubeletLabel: exact allowed keys plus kubelet/node.kubernetes.io namespaces."""
    if key in KUBELET_LABELS:
        return True
    ns = _namespace(key)
    return any(_in_namespace(ns, allowed) for allowed in KUBELET_NAMESPACES)


def self_settable(key: str) -> bool:
    """True when NodeRestriction lets a node set `key` on its own Node object."""
    ns = _namespace(key)
    if _in_namespace(ns, NODE_RESTRICTION_NAMESPACE):
        return False
    if any(_in_namespace(ns, r) for r in RESTRICTED_NAMESPACES):
        return is_kubelet_label(key)
    return True


def why_not_self_settable(key: str) -> str | None:
    """One line explaining why a kubelet cannot set `key` itself (None when it can)."""
    if self_settable(key):
        return None
    ns = _namespace(key)
    if _in_namespace(ns, NODE_RESTRICTION_NAMESPACE):
        return (f"{key}: labels under {NODE_RESTRICTION_NAMESPACE} are reserved for administrators; "
                "NodeRestriction refuses them from a kubelet")
    if key.startswith("node-role.kubernetes.io/"):
        return (f"{key}: a kubelet may not set node-role labels (--node-labels would make the kubelet "
                "refuse to start); apply it afterwards with an admin client "
                "(`nodeprep labels --apply --kubeconfig ADMIN.conf` or kubectl label)")
    return (f"{key}: kubernetes.io/k8s.io labels other than the kubelet's allowed set cannot be "
            "self-set (NodeRestriction); apply it with an admin client")
