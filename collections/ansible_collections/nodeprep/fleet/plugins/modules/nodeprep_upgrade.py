#!/usr/bin/python
# Copyright: nodeprep maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nodeprep_upgrade
short_description: A node's own steps of a driver rollout (reload or reboot, revert)
description:
  - V(reload) calls C(nodeprep.upgrade.nodeside.replace), as C(nodeprep upgrade reload) does -
    replaces the loaded nvidia modules with O(version)'s in place when nothing holds them (module
    reference counts and holders, processes with /dev/nvidia* open) and returns C(reboot_required)
    otherwise; on an image root nothing is loaded.
  - V(revert) calls C(nodeprep.upgrade.nodeside.revert), as C(nodeprep upgrade revert) does - rolls
    O(version) back to the previous driver when it is the active one (nodeprep rollback); nothing
    otherwise.
version_added: "0.1.0"
options:
  action:
    description: The step.
    type: str
    required: true
    choices: [reload, revert]
  version:
    description: The driver version the rollout installs.
    type: str
    required: true
  sysfs_root:
    description: Stands for /sys (module reference counts); default ROOT/sys.
    type: str
  modules:
    description: Modules loaded after an unload, in order.
    type: list
    elements: str
    default: [nvidia, nvidia-uvm, nvidia-modeset]
  load:
    description: With V(revert), load the previous version's modules.
    type: bool
    default: true
attributes:
  diff_mode:
    support: none
extends_documentation_fragment:
  - nodeprep.fleet.nodeprep
  - nodeprep.fleet.nodeprep.node
"""

EXAMPLES = r"""
- name: Upgrade | Reload the modules or say reboot
  nodeprep.fleet.nodeprep_upgrade:
    action: reload
    version: "550.163.01"
  register: reload
- name: Upgrade | Reboot when the modules are held
  ansible.builtin.reboot:
  when: reload.reboot_required
"""

RETURN = r"""
action:
  description: With V(reload) - the decision, one of none, load, reload, reboot.
  returned: action is reload
  type: str
reboot_required:
  description: With V(reload) - whether the modules are held and only a reboot replaces them.
  returned: action is reload
  type: bool
reasons:
  description: With V(reload) - why.
  returned: action is reload
  type: list
  elements: str
reverted:
  description: With V(revert) - whether the version was rolled back.
  returned: action is revert
  type: bool
active:
  description: With V(revert) - the active version afterwards.
  returned: action is revert
  type: str
"""

from ansible_collections.nodeprep.fleet.plugins.module_utils.nodeprep_op_upgrade import main

if __name__ == "__main__":
    main()
