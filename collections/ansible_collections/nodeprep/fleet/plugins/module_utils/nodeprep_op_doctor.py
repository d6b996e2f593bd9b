# Copyright: nodeprep maintainers
# Apache-2.0
"""What nodeprep.fleet.nodeprep_doctor does on the node (its documentation is in
plugins/modules/nodeprep_doctor.py). Its entry point is main()."""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.nodeprep.fleet.plugins.module_utils.nodeprep_host import (
    COMMON_ARGUMENT_SPEC,
    doctor_problems,
    fail_from,
    import_nodeprep,
    nodeprep_errors,
)


def argument_spec():
    spec = dict(COMMON_ARGUMENT_SPEC)
    spec.update(
        checks={"type": "list", "elements": "str", "default": []},
        require_cuda={"type": "str"},
        expect_version={"type": "str"},
    )
    return spec


def run(module):
    """The nodeprep_doctor task on a validated AnsibleModule (see modules/nodeprep_doctor.py)."""
    p = module.params
    (doctor_mod,) = import_nodeprep(module, "nodeprep.node.doctor")
    from pathlib import Path

    try:
        problems, checks, active = doctor_problems(
            doctor_mod, Path(p["root"]), p["checks"], p["require_cuda"], p["expect_version"]
        )
    except nodeprep_errors(module) as e:
        fail_from(module, e)
    if problems:
        module.fail_json(msg="doctor: " + "; ".join(problems), ok=False, checks=checks, active=active)
    module.exit_json(changed=False, ok=True, checks=checks, active=active)


def main():
    run(AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True))
