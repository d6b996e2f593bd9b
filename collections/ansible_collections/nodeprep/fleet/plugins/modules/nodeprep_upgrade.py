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
  - V(selftest) calls C(nodeprep.upgrade.nodeside.selftest), as C(nodeprep verify-gpus --apply) does -
    runs the GPU self-test and publishes its verdict on the Node with the node's own credential, so
    C(nodeprep verify-nodes) lifts the C(nodeprep.dev/unverified) taint; fails listing the problems.
    With O(kubeconfig) empty (no cluster) the self-test only, nothing published.
version_added: "0.1.0"
options:
  action:
    description: The step.
    type: str
    required: true
    choices: [reload, revert, selftest]
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
  kubeconfig:
    description: With V(selftest) - the node's own credential; empty - publish nothing (no cluster).
    type: str
    default: /etc/kubernetes/kubelet.conf
  node:
    description: With V(selftest) - the Node's name.
    type: str
  persistence_mode:
    description: With V(selftest) - the persistence mode every GPU must have.
    type: str
    choices: [any, enabled, disabled]
    default: any
  nvidia_smi_xml:
    description: With V(selftest) - read GPU facts from this C(nvidia-smi -q -x) capture on the node.
    type: str
  label_timeout:
    description:
      - With V(selftest) and a O(kubeconfig) - seconds to wait for the Node's C(nodeprep.dev/driver-version)
        label to name the tested driver (NFD publishes it from the labels file a while after it changed)
        before the verdict is published; a verdict for another label is C(failed).
    type: float
    default: 0
extends_documentation_fragment:
  - nodeprep.fleet.nodeprep.no_diff
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
passed:
  description: With V(selftest) - whether the self-test passed.
  returned: action is selftest
  type: bool
label:
  description: With V(selftest) - the verdict label published (a digest, or failed; empty when not published).
  returned: action is selftest
  type: str
published:
  description: With V(selftest) - whether the verdict was published on the Node.
  returned: action is selftest
  type: bool
"""

from ansible_collections.nodeprep.fleet.plugins.module_utils.nodeprep_op_upgrade import main

if __name__ == "__main__":
    main()
