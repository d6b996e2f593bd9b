# Copyright: nodeprep maintainers
# Apache-2.0
"""What nodeprep.fleet.nodeprep_profile does on the node (its documentation is in
plugins/modules/nodeprep_profile.py). Its entry point is main()."""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.nodeprep.fleet.plugins.module_utils import nodeprep_host as host


def argument_spec():
    return host.node_argument_spec(
        **host.PROFILE_ARGUMENT_SPEC,
        content={"type": "dict", "required": True},
        path={"type": "str", "default": "/etc/nodeprep/node.yaml"},
    )


def run(module):
    """The nodeprep_profile task on a validated AnsibleModule (see modules/nodeprep_profile.py)."""
    p = module.params
    (profile_mod,) = host.import_nodeprep(module, "nodeprep.profile")
    try:
        profile = profile_mod.parse_profile(
            p["content"], source=p["path"], insecure_skip_ca_verification=p["insecure_skip_ca_verification"])
    except host.nodeprep_errors(module) as e:
        host.fail_from(module, e, path=p["path"])
    text = host.profile_text(p["content"])
    changed, diff = host.write_if_changed(module, host.under_root(module, p["root"], p["path"]), text, 0o644)
    out = {"changed": changed, "path": p["path"], "profile": profile.to_dict()}
    host.exit_with(module, out, diff)


def main():
    run(AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True))
