"""Renderings of a label set: kubelet --node-labels, JSON, YAML, NFD local feature file."""

from __future__ import annotations

import json
from collections.abc import Mapping

import yaml

from .validate import RESTRICTED_NAMESPACES, _in_namespace, _namespace, kubelet_flag_value, split_for_kubelet

FORMATS = ("kubelet", "json", "yaml", "nfd")


def render_kubelet(labels: Mapping[str, str]) -> str:
    """The `--node-labels` value: the self-settable labels only, comma-joined."""
    mine, _ = split_for_kubelet(labels)
    return kubelet_flag_value(mine)


def render_json(data: Mapping[str, object]) -> str:
    return json.dumps(data, indent=2, sort_keys=True)


def render_yaml(data: Mapping[str, object]) -> str:
    return yaml.safe_dump(dict(data), sort_keys=True, default_flow_style=False)


def render_nfd(labels: Mapping[str, str]) -> str:
    """An NFD `features.d` file (`key=value` lines). NFD refuses kubernetes.io/k8s.io namespaces
    from feature files, so those labels are left out (set them with --node-labels or --apply)."""
    lines = ["# Written by nodeprep labels; read by NFD's local feature source."]
    skipped = []
    for key, value in sorted(labels.items()):
        if any(_in_namespace(_namespace(key), ns) for ns in RESTRICTED_NAMESPACES):
            skipped.append(key)
            continue
        lines.append(f"{key}={value}")
    if skipped:
        lines.insert(1, "# not here (NFD denies kubernetes.io namespaces): " + ", ".join(skipped))
    return "\n".join(lines) + "\n"


def parse_nfd(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value
    return out
