"""GPU node labels: facts (NVML, nvidia-smi, PCI sysfs, DMI, cloud metadata) -> GFD-compatible,
validated Kubernetes labels, split by what a kubelet may set on itself.

Public API (used by `nodeprep labels`, join and bootstrap):
    node_labels(LabelOptions(...)) -> LabelResult   (labels, facts, sources, warnings)
    validate_label(key, value) -> list[str]
    split_for_kubelet(labels) -> (self_settable, needs_api)
    kubelet_flag_value(labels) -> str               (the --node-labels value; InputError if refused)
    apply_labels(load_kubeconfig(path), node, labels) -> ApplyResult
"""

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


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    if name in ("apply_labels", "load_kubeconfig"):
        from . import apply

        return getattr(apply, name)
    raise AttributeError(name)
