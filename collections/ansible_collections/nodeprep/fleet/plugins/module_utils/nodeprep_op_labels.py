# Copyright: nodeprep maintainers
# Apache-2.0
"""What nodeprep.fleet.nodeprep_labels does on the node (its documentation is in
plugins/modules/nodeprep_labels.py). Its entry point is main()."""

from __future__ import annotations

import json

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.nodeprep.fleet.plugins.module_utils import nodeprep_host as host


def argument_spec():
    return host.node_argument_spec(
        extra={"type": "dict", "default": {}},
        cloud={"type": "str", "choices": ["auto", "aws", "gce", "azure", "none"], "default": "auto"},
        mig_strategy={"type": "str", "choices": ["none", "single", "mixed"], "default": "none"},
        nvidia_smi_xml={"type": "path"},
        kernel={"type": "str"},
        nfd_file={"type": "str", "default": "/etc/kubernetes/node-feature-discovery/features.d/nodeprep"},
        json_file={"type": "str", "default": "/var/lib/nodeprep/labels.json"},
    )


def run(module):
    """The nodeprep_labels task on a validated AnsibleModule (see modules/nodeprep_labels.py)."""
    p = module.params
    labeling, settings_mod, output = host.import_nodeprep(
        module, "nodeprep.node.labeling", "nodeprep.labels.profilelabels", "nodeprep.labels.output"
    )
    from pathlib import Path

    root = p["root"]
    try:
        settings = settings_mod.ProfileLabels(extra={str(k): str(v) for k, v in p["extra"].items()},
                                              cloud=p["cloud"], kernel=p["kernel"] or None)
        # the one call `nodeprep labels` and bootstrap make: the root's facts by the rule every
        # front-end uses, the GPU facts recorded (in check mode planned) beneath the root
        labelled = labeling.label_node(Path(root or "/"), labeling.LabelNode(
            settings, check=module.check_mode, options={
                "nvidia_smi_xml": Path(p["nvidia_smi_xml"]) if p["nvidia_smi_xml"] else None,
                "mig_strategy": p["mig_strategy"]}))
        result, facts = labelled.result, labelled.facts
        if labelled.facts_warning:  # advisory, as for `nodeprep labels`: the gate keeps compat off
            module.warn(labelled.facts_warning)
        mine, api = result.split()
        files = []
        if p["nfd_file"]:
            files.append((host.under_root(module, root, p["nfd_file"]), output.render_nfd(result.labels)))
        if p["json_file"]:
            doc = {"labels": result.labels, "kubelet": mine, "api": api}
            text = json.dumps(doc, indent=2, sort_keys=True) + "\n"
            files.append((host.under_root(module, root, p["json_file"]), text))
    except host.nodeprep_errors(module) as e:
        host.fail_from(module, e)
    changed, diffs = False, []
    for path, content in files:
        file_changed, diff = host.write_if_changed(module, path, content)
        changed |= file_changed
        if file_changed:
            diffs.append(diff)
    if facts is not None and facts.changed:
        changed = True
        diffs.append({"before_header": str(facts.file), "after_header": str(facts.file),
                      "before": facts.before, "after": facts.content})
    out = {
        "changed": changed,
        "labels": result.labels,
        "kubelet_labels": mine,
        "api_labels": api,
        "sources": result.sources,
        "warnings_seen": result.warnings,
        "gpu_facts": None if facts is None else str(facts.file),
    }
    host.exit_with(module, out, diffs)


def main():
    run(AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True))
