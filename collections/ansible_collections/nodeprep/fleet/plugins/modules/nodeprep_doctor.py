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
  checks:
    description: >-
      Checks to run; empty runs all (state, gpu, module, kmod, devices, ldcache, cuda, support,
      hooks: no container hook on the node is started with a container's environment).
    type: list
    elements: str
    default: []
  require_cuda:
    description: CUDA version the active driver must support, for example V(12.2).
    type: str
  expect_version:
    description: Fail unless this driver version is the active one.
    type: str
extends_documentation_fragment:
  - nodeprep.fleet.nodeprep.no_diff
  - nodeprep.fleet.nodeprep
  - nodeprep.fleet.nodeprep.node
"""

EXAMPLES = r"""
- name: NVIDIA driver | Gate on the doctor
  nodeprep.fleet.nodeprep_doctor:
    expect_version: "535.309.01"
"""

RETURN = r"""
preflight:
  description: >-
    The problems the gate would stop on, also shown as warnings; in check mode the task reports them (ok
    false) instead of failing.
  returned: check mode
  type: list
  elements: str
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

from ansible_collections.nodeprep.fleet.plugins.module_utils.nodeprep_op_doctor import main

if __name__ == "__main__":
    main()
