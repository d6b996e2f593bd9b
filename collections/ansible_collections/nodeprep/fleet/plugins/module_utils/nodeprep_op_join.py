# Copyright: nodeprep maintainers
# Apache-2.0
"""What nodeprep.fleet.nodeprep_join does on the node (its documentation is in
plugins/modules/nodeprep_join.py). Its entry point is main()."""

from __future__ import annotations

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.nodeprep.fleet.plugins.module_utils import nodeprep_host as host
from ansible_collections.nodeprep.fleet.plugins.module_utils import nodeprep_op_runtime as runtime_op


def argument_spec():
    return host.node_argument_spec(
        **host.SECTION_ARGUMENT_SPEC,
        dry_run={"type": "bool", "default": False},
        insecure_skip_ca_verification={"type": "bool", "default": False},
        skip_preflight={"type": "bool", "default": False},
        skip_discovery={"type": "bool", "default": False},
        nvidia_smi_xml={"type": "path"},
        token={"type": "str", "default": "", "no_log": True},
        token_file={"type": "str", "default": "/etc/nodeprep/bootstrap-token"},
    )


def write_token(module, p):
    """Write O(token) to O(token_file) under O(root) (0600) when it differs; (changed, masked diffs)."""
    if not p["token"]:
        return False, []
    path = host.under_root(module, p["root"], p["token_file"])
    existed = os.path.exists(path)
    changed, _ = host.write_if_changed(module, path, p["token"].strip() + "\n", 0o600)
    if not changed:
        return False, []
    before = "(secret content not shown)\n" if existed else ""
    after = "(secret content not shown, sha256 changed)\n" if existed else "(secret)\n"
    return True, [{"before_header": path, "after_header": path, "before": before, "after": after}]


def run(module):
    """The nodeprep_join task on a validated AnsibleModule (see modules/nodeprep_join.py)."""
    p = module.params
    if p["state"] == "absent":  # what `nodeprep uninstall` undoes of the join; the token file stays
        removal_mod, profile_mod = host.import_nodeprep(module, "nodeprep.join.removal", "nodeprep.profile")
        runtime_op.remove(module, removal_mod, profile_mod, join=True)
        return
    usecase, profile_mod, token_mod = host.import_nodeprep(
        module, "nodeprep.join.joining", "nodeprep.profile", "nodeprep.join.token"
    )
    from pathlib import Path

    try:
        # validated before anything is written; in check mode the plan uses it instead of the file
        token = token_mod.parse_token(p["token"], source="token") if p["token"] else None
    except host.nodeprep_errors(module) as e:
        host.fail_from(module, e)
    token_changed, token_diffs = write_token(module, p)

    try:
        profile = host.load_profile(module, profile_mod, p["root"], p["profile"],
                                    insecure_skip_ca_verification=p["insecure_skip_ca_verification"])
        outcome = usecase.join_cluster(Path(p["root"]), usecase.JoinRequest(
            profile,
            check=module.check_mode,
            dry_run=p["dry_run"],
            insecure_skip_ca_verification=p["insecure_skip_ca_verification"],
            skip_preflight=p["skip_preflight"],
            discovery=not p["skip_discovery"],
            nvidia_smi_xml=Path(p["nvidia_smi_xml"]) if p["nvidia_smi_xml"] else None,
            token=token if module.check_mode else None,
        ))
        plan = outcome.plan
        summary = outcome.planned
        diffs = host.change_diffs(outcome.files)  # as they were before the apply
        diffs = token_diffs + diffs
        changed = (token_changed or any(f.changed for f in outcome.files)
                   or (not p["dry_run"] and plan.changed))
        commands = []
        if not module.check_mode:
            changed = token_changed or outcome.result["changed"]
            commands = outcome.result["ran"]
    except host.nodeprep_errors(module) as e:
        host.fail_from(module, e)
    out = {"changed": changed, "plan": summary, "already_joined": plan.already_joined, "commands": commands}
    # a real run refuses on the preflight findings (apply_join); a check shows them
    host.exit_with(module, out, diffs, preflight=plan.preflight)


def main():
    run(AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True))
