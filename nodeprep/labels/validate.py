"""Label checks that raise InputError, and the kubelet/API split of a label set.

The rules themselves (syntax, what a kubelet may self-set) live in nodeprep.labelrules, below both
the profile and this package; they are re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import InputError
from ..labelrules import (
    KUBELET_LABELS,
    KUBELET_NAMESPACES,
    NAME_MAX,
    NODE_RESTRICTION_NAMESPACE,
    PREFIX_MAX,
    RESTRICTED_NAMESPACES,
    VALUE_MAX,
    _in_namespace,
    _namespace,
    is_kubelet_label,
    sanitise,
    self_settable,
    validate_key,
    validate_label,
    validate_value,
    why_not_self_settable,
)

__all__ = [
    "KUBELET_LABELS", "KUBELET_NAMESPACES", "NAME_MAX", "NODE_RESTRICTION_NAMESPACE", "PREFIX_MAX",
    "RESTRICTED_NAMESPACES", "VALUE_MAX", "_in_namespace", "_namespace", "check_kubelet_labels",
    "check_labels", "is_kubelet_label", "kubelet_flag_value", "parse_label_arg", "sanitise",
    "self_settable", "split_for_kubelet", "validate_key", "validate_label", "validate_value",
    "why_not_self_settable",
]


def check_labels(labels: Mapping[str, str], *, source: str = "label") -> None:
    """Raise InputError naming every invalid label."""
    problems = [p for k, v in labels.items() for p in validate_label(k, v)]
    if problems:
        raise InputError(f"invalid {source}: " + "; ".join(problems))


def parse_label_arg(text: str) -> tuple[str, str]:
    """`key=value` (value may be empty) -> (key, value), validated; InputError otherwise."""
    if "=" not in text:
        raise InputError(f"invalid --label {text!r}: expected KEY=VALUE")
    key, value = text.split("=", 1)
    key, value = key.strip(), value.strip()
    problems = validate_label(key, value)
    if problems:
        raise InputError(f"invalid --label {text!r}: " + "; ".join(problems))
    return key, value


def split_for_kubelet(labels: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(self_settable, needs_api): what a kubelet may put in --node-labels, what needs an API write."""
    mine: dict[str, str] = {}
    api: dict[str, str] = {}
    for key, value in labels.items():
        (mine if self_settable(key) else api)[key] = value
    return mine, api


def check_kubelet_labels(labels: Mapping[str, str]) -> None:
    """InputError when a label the user wants in kubelet flags cannot be self-set."""
    problems = [why for key in labels if (why := why_not_self_settable(key))]
    if problems:
        raise InputError("labels not allowed in kubelet --node-labels: " + "; ".join(problems))


def kubelet_flag_value(labels: Mapping[str, str]) -> str:
    """The comma-joined `--node-labels` value (sorted, validated, self-settable only)."""
    check_labels(labels)
    check_kubelet_labels(labels)
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
