#!/usr/bin/python
# Copyright: nodeprep maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nodeprep_node
short_description: Run one nodeprep task on a node (the payload behind the collection's node-side modules)
description:
  - The action plugins of V(nodeprep_build), V(nodeprep_doctor), V(nodeprep_driver),
    V(nodeprep_info), V(nodeprep_join), V(nodeprep_labels), V(nodeprep_profile),
    V(nodeprep_runtime) and V(nodeprep_unpack) send this one module with O(nodeprep_operation)
    set, so Ansible builds one module payload per playbook run instead of one per module (each
    build parses ansible-core's module_utils again, about 0.2 s of controller CPU).
  - The operation's own options are validated here with that module's argument spec, so errors,
    check mode, diff mode and no_log options behave exactly as in the module itself.
  - Use the named modules in playbooks; this one is internal.
version_added: "0.1.0"
options:
  nodeprep_operation:
    description: Which module's task to run; every other option is that module's.
    type: str
    required: true
    choices: [build, doctor, driver, info, join, labels, profile, runtime, unpack]
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
author:
  - nodeprep maintainers
"""

EXAMPLES = r"""
# Internal: written by the action plugins. The same as nodeprep.fleet.nodeprep_doctor with checks [state]:
- name: Nodeprep | Check the driver state
  nodeprep.fleet.nodeprep_node:
    nodeprep_operation: doctor
    checks: [state]
"""

RETURN = r"""
changed:
  description: Whatever the operation's module returns (see that module).
  returned: always
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule, _load_params
from ansible_collections.nodeprep.fleet.plugins.module_utils import (
    nodeprep_op_build,
    nodeprep_op_doctor,
    nodeprep_op_driver,
    nodeprep_op_info,
    nodeprep_op_join,
    nodeprep_op_labels,
    nodeprep_op_profile,
    nodeprep_op_runtime,
    nodeprep_op_unpack,
)

OPERATIONS = {
    "build": nodeprep_op_build,
    "doctor": nodeprep_op_doctor,
    "driver": nodeprep_op_driver,
    "info": nodeprep_op_info,
    "join": nodeprep_op_join,
    "labels": nodeprep_op_labels,
    "profile": nodeprep_op_profile,
    "runtime": nodeprep_op_runtime,
    "unpack": nodeprep_op_unpack,
}


def argument_spec():
    return {"nodeprep_operation": {"type": "str", "required": True, "choices": sorted(OPERATIONS)}}


def main():
    operation = OPERATIONS.get(_load_params().get("nodeprep_operation"))
    if operation is None:  # argument validation names the bad value and the choices
        AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
        return
    spec = dict(operation.argument_spec(), **argument_spec())
    operation.run(AnsibleModule(argument_spec=spec, supports_check_mode=True))


if __name__ == "__main__":
    main()
