# Copyright: nodeprep maintainers
# Apache-2.0
"""What nodeprep.fleet.nodeprep_doctor does on the node (its documentation is in
plugins/modules/nodeprep_doctor.py). Its entry point is main()."""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.nodeprep.fleet.plugins.module_utils import nodeprep_host as host


def argument_spec():
    return host.node_argument_spec(
        checks={"type": "list", "elements": "str", "default": []},
        require_cuda={"type": "str"},
        expect_version={"type": "str"},
    )


def run(module):
    """The nodeprep_doctor task on a validated AnsibleModule (see modules/nodeprep_doctor.py)."""
    p = module.params
    (doctor_mod,) = host.import_nodeprep(module, "nodeprep.node.doctor")
    from pathlib import Path

    try:
        problems, checks, active = host.doctor_problems(
            doctor_mod, Path(p["root"]), p["checks"], p["require_cuda"], p["expect_version"]
        )
    except host.nodeprep_errors(module) as e:
        host.fail_from(module, e)
    if problems and module.check_mode:  # a check shows what the gate would stop on; it does not stop
        host.report_findings(module, problems)
        module.exit_json(changed=False, ok=False, checks=checks, active=active, preflight=problems)
    if problems:
        module.fail_json(msg="doctor: " + "; ".join(problems), ok=False, checks=checks, active=active)
    module.exit_json(changed=False, ok=True, checks=checks, active=active)


def main():
    run(AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True))
