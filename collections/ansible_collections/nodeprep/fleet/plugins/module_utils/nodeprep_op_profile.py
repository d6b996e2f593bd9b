# Copyright: nodeprep maintainers
# Apache-2.0
"""What nodeprep.fleet.nodeprep_profile does on the node (its documentation is in
plugins/modules/nodeprep_profile.py). Its entry point is main()."""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.nodeprep.fleet.plugins.module_utils.nodeprep_host import (
    COMMON_ARGUMENT_SPEC,
    fail_from,
    import_nodeprep,
    nodeprep_errors,
    profile_text,
    under_root,
    write_if_changed,
)


def argument_spec():
    spec = dict(COMMON_ARGUMENT_SPEC)
    spec.update(
        content={"type": "dict", "required": True},
        path={"type": "str", "default": "/etc/nodeprep/node.yaml"},
    )
    return spec


def run(module):
    """The nodeprep_profile task on a validated AnsibleModule (see modules/nodeprep_profile.py)."""
    p = module.params
    (profile_mod,) = import_nodeprep(module, "nodeprep.profile")
    try:
        profile = profile_mod.parse_profile(p["content"], source=p["path"])
    except nodeprep_errors(module) as e:
        fail_from(module, e, path=p["path"])
    text = profile_text(p["content"])
    changed, diff = write_if_changed(module, under_root(p["root"], p["path"]), text, 0o644)
    out = {"changed": changed, "path": p["path"], "profile": profile.to_dict()}
    if module._diff:
        out["diff"] = diff
    module.exit_json(**out)


def main():
    run(AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True))
