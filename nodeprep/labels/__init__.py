"""GPU node labels: facts (NVML, nvidia-smi, PCI sysfs, DMI, cloud metadata) -> GFD-compatible,
validated Kubernetes labels, split by what a kubelet may set on itself.

Public API (used by `nodeprep labels`, join and bootstrap):
    node_labels(LabelOptions(...)) -> LabelResult   (labels, facts, sources, warnings)
    validate_label(key, value) -> list[str]
    split_for_kubelet(labels) -> (self_settable, needs_api)
    kubelet_flag_value(labels) -> str               (the --node-labels value; InputError if refused)
    apply_labels(load_kubeconfig(path), node, labels) -> ApplyResult
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:
    from .apply import apply_labels, load_kubeconfig
    from .core import PREFIX, LabelOptions, LabelResult, build_labels, gather_facts, node_labels
    from .validate import (
        check_kubelet_labels,
        check_labels,
        kubelet_flag_value,
        parse_label_arg,
        sanitise,
        self_settable,
        split_for_kubelet,
        validate_label,
    )

__all__ = [
    "PREFIX", "LabelOptions", "LabelResult", "build_labels", "gather_facts", "node_labels",
    "check_kubelet_labels", "check_labels", "kubelet_flag_value", "parse_label_arg", "sanitise",
    "self_settable", "split_for_kubelet", "validate_label", "apply_labels", "load_kubeconfig",
]

# nodeprep.labels.gpu alone (join's GPU list) must not load the metadata client or the API client.
__getattr__ = lazy_exports(__name__, {
    **dict.fromkeys(
        ["PREFIX", "LabelOptions", "LabelResult", "build_labels", "gather_facts", "node_labels"], "core"
    ),
    **dict.fromkeys(
        ["check_kubelet_labels", "check_labels", "kubelet_flag_value", "parse_label_arg", "sanitise",
         "self_settable", "split_for_kubelet", "validate_label"],
        "validate",
    ),
    "apply_labels": "apply",
    "load_kubeconfig": "apply",
})
