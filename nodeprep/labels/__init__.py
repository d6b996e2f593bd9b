"""GPU node labels: facts (NVML, nvidia-smi, PCI sysfs, DMI, cloud metadata) -> GFD-compatible,
validated Kubernetes labels, split by what a kubelet may set on itself.

Public API (used by `nodeprep labels`, join and bootstrap); import each name from its module (this
package imports nothing, so that nodeprep.labels.gpu alone, join's GPU list, does not load the cloud
metadata client or the API client):
    nodeprep.labels.core.node_labels(LabelOptions(...)) -> LabelResult   (labels, facts, sources, warnings)
    nodeprep.labels.validate.validate_label(key, value) -> list[str]
    nodeprep.labels.validate.split_for_kubelet(labels) -> (self_settable, needs_api)
    nodeprep.labels.validate.kubelet_flag_value(labels) -> str
        (the --node-labels value; InputError if refused)
    nodeprep.labels.nodepatch.apply_labels(nodeprep.kubeapi.load_kubeconfig(path), node, labels)
        -> ApplyResult
"""
