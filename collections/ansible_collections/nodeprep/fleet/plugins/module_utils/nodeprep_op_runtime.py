# Copyright: nodeprep maintainers
# Apache-2.0
"""What nodeprep.fleet.nodeprep_runtime does on the node (its documentation is in
plugins/modules/nodeprep_runtime.py). Its entry point is main()."""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.nodeprep.fleet.plugins.module_utils import nodeprep_host as host


def argument_spec():
    return host.node_argument_spec(
        **host.PROFILE_ARGUMENT_SPEC,
        **host.SECTION_ARGUMENT_SPEC,
        nvidia_smi_xml={"type": "path"},
    )


def remove(module, removal_mod, profile_mod, join=False):
    """state=absent: undo what nodeprep runtime wrote (nodeprep.join.removal), with `join` what
    nodeprep join wrote too (the nodeprep_join module's); check mode: the plan."""
    from pathlib import Path

    p = module.params
    root = Path(p["root"])
    try:
        profile = None
        if Path(host.under_root(module, p["root"], p["profile"])).is_file():
            profile = host.load_profile(module, profile_mod, p["root"], p["profile"],
                                        insecure_skip_ca_verification=p["insecure_skip_ca_verification"])
        removal = removal_mod.plan_removal(root, profile, join=join)
        result = removal_mod.apply_removal(removal, root=root, live=root.resolve() == Path("/"),
                                           check=module.check_mode)
    except host.nodeprep_errors(module) as e:
        host.fail_from(module, e)
    for line in result["kept"] + result["notes"]:
        module.warn(line)
    present_keys = {} if join else {"files": [], "warnings_seen": []}  # the runtime module's RETURN
    module.exit_json(changed=result["changed"], commands=result["ran"], removed=result["removed"],
                     restored=result["restored"], kept=result["kept"], **present_keys)


def run(module):
    """The nodeprep_runtime task on a validated AnsibleModule (see modules/nodeprep_runtime.py)."""
    p = module.params
    usecase, profile_mod = host.import_nodeprep(module, "nodeprep.runtime.configure", "nodeprep.profile")
    if p["state"] == "absent":
        (removal_mod,) = host.import_nodeprep(module, "nodeprep.join.removal")
        remove(module, removal_mod, profile_mod)
        return
    from pathlib import Path

    try:
        profile = host.load_profile(module, profile_mod, p["root"], p["profile"],
                                   insecure_skip_ca_verification=p["insecure_skip_ca_verification"])
        outcome = usecase.configure_runtime(Path(p["root"]), usecase.RuntimeRequest(
            profile, check=module.check_mode,
            nvidia_smi_xml=Path(p["nvidia_smi_xml"]) if p["nvidia_smi_xml"] else None))
        plan = outcome.plan
        files = [f.summary() for f in outcome.files]  # as they were before the apply
        diffs = host.change_diffs(outcome.files)
        commands = [list(a.argv) for a in plan.actions if not a.deferred]
        changed = plan.changed
        if outcome.applied is not None:
            changed = outcome.applied["changed"]
            commands = outcome.applied["ran"]
    except host.nodeprep_errors(module) as e:
        host.fail_from(module, e)
    out = {"changed": changed, "files": files, "commands": commands, "warnings_seen": list(plan.warnings)}
    host.exit_with(module, out, diffs, preflight=plan.preflight)


def main():
    run(AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True))
