#!/usr/bin/python
# Copyright: nodeprep maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nodeprep_doctor
short_description: Check that a node's active NVIDIA driver is usable (nodeprep doctor) and fail if not
description:
  - Calls C(nodeprep.node.doctor) and fails, listing every failed check, when the report is not ok.
    Used as the gate after each batch of a rolling driver upgrade. Never changes anything.
version_added: "0.1.0"
options:
  nodeprep_path:
    description: The nodeprep library on the node (the directory nodeprep_install unpacks, or a zipapp).
    type: path
    default: /usr/local/lib/nodeprep/lib
  root:
    description: Root of the node's filesystem.
    type: path
    default: /
  checks:
    description: Checks to run; empty runs all (state, gpu, module, kmod, devices, ldcache, cuda).
    type: list
    elements: str
    default: []
  require_cuda:
    description: CUDA version the active driver must support, for example V(12.2).
    type: str
  expect_version:
    description: Fail unless this driver version is the active one.
    type: str
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
author:
  - nodeprep maintainers
"""

EXAMPLES = r"""
- name: NVIDIA driver | Gate on the doctor
  nodeprep.fleet.nodeprep_doctor:
    expect_version: "535.309.01"
"""

RETURN = r"""
ok:
  description: Whether every check passed.
  returned: always
  type: bool
checks:
  description: The report, one entry per check.
  returned: always
  type: list
  elements: dict
active:
  description: The active driver version.
  returned: always
  type: str
"""

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


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
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


if __name__ == "__main__":
    main()
