# Copyright: nodeprep maintainers
# Apache-2.0
"""What nodeprep.fleet.nodeprep_upgrade does on the node (its documentation is in
plugins/modules/nodeprep_upgrade.py). Its entry point is main()."""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.nodeprep.fleet.plugins.module_utils import nodeprep_host as host


def argument_spec():
    return host.node_argument_spec(
        action={"type": "str", "required": True, "choices": ["reload", "revert"]},
        version={"type": "str", "required": True},
        sysfs_root={"type": "str"},
        modules={"type": "list", "elements": "str", "default": ["nvidia", "nvidia-uvm", "nvidia-modeset"]},
        load={"type": "bool", "default": True},
    )


def run(module):
    """The nodeprep_upgrade task on a validated AnsibleModule (see modules/nodeprep_upgrade.py)."""
    p = module.params
    (nodeside,) = host.import_nodeprep(module, "nodeprep.upgrade.nodeside")
    from pathlib import Path

    root = Path(p["root"])
    try:
        if p["action"] == "reload":
            sysfs = Path(p["sysfs_root"]) if p["sysfs_root"] else None
            res = nodeside.replace(root, p["version"], sysfs_root=sysfs, modules=tuple(p["modules"]),
                                   check=module.check_mode)
        else:
            res = nodeside.revert(root, p["version"], load=p["load"], modules=tuple(p["modules"]),
                                  check=module.check_mode)
    except host.nodeprep_errors(module) as e:
        host.fail_from(module, e)
    module.exit_json(**res.to_dict())


def main():
    run(AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True))
