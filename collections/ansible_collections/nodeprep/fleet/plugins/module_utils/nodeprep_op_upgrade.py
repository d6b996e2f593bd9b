# Copyright: nodeprep maintainers
# Apache-2.0
"""What nodeprep.fleet.nodeprep_upgrade does on the node (its documentation is in
plugins/modules/nodeprep_upgrade.py). Its entry point is main()."""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.nodeprep.fleet.plugins.module_utils import nodeprep_host as host


def argument_spec():
    return host.node_argument_spec(
        action={"type": "str", "required": True, "choices": ["reload", "revert", "selftest"]},
        version={"type": "str", "required": True},
        sysfs_root={"type": "str"},
        modules={"type": "list", "elements": "str", "default": ["nvidia", "nvidia-uvm", "nvidia-modeset"]},
        load={"type": "bool", "default": True},
        kubeconfig={"type": "str", "default": "/etc/kubernetes/kubelet.conf"},
        node={"type": "str"},
        persistence_mode={"type": "str", "choices": ["any", "enabled", "disabled"], "default": "any"},
        nvidia_smi_xml={"type": "str"},
        label_timeout={"type": "float", "default": 0},
    )


def run(module):
    """The nodeprep_upgrade task on a validated AnsibleModule (see modules/nodeprep_upgrade.py)."""
    p = module.params
    (nodeside,) = host.import_nodeprep(module, "nodeprep.upgrade.nodeside")
    from pathlib import Path

    root = Path(p["root"])
    sysfs = Path(p["sysfs_root"]) if p["sysfs_root"] else None
    try:
        if p["action"] == "reload":
            res = nodeside.replace(root, p["version"], sysfs_root=sysfs, modules=tuple(p["modules"]),
                                   check=module.check_mode)
        elif p["action"] == "selftest":
            if not p["node"]:
                module.fail_json(msg="node: required with action selftest", exit_code=2)
            res = nodeside.selftest(root, kubeconfig=Path(p["kubeconfig"]) if p["kubeconfig"] else None,
                                    node=p["node"], sysfs_root=sysfs,
                                    persistence_mode=p["persistence_mode"], check=module.check_mode,
                                    label_timeout=p["label_timeout"],
                                    nvidia_smi_xml=Path(p["nvidia_smi_xml"]) if p["nvidia_smi_xml"] else None)
            if not res.passed and not module.check_mode:
                module.fail_json(msg="GPU self-test failed: " + "; ".join(res.problems), **res.to_dict())
        else:
            res = nodeside.revert(root, p["version"], load=p["load"], modules=tuple(p["modules"]),
                                  check=module.check_mode)
    except host.nodeprep_errors(module) as e:
        host.fail_from(module, e)
    module.exit_json(**res.to_dict())


def main():
    run(AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True))
