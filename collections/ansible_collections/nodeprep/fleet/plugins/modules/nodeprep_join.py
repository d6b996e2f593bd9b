#!/usr/bin/python
# Copyright: nodeprep maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nodeprep_join
short_description: Join a GPU node to Kubernetes with nodeprep (kubeadm or kubelet bootstrap)
description:
  - Reads the node profile's C(cluster) section and calls C(nodeprep.join.joinplan.plan_join) then
    C(nodeprep.join.apply.apply_join) - JoinConfiguration (v1beta3 below 1.31, v1beta4 from 1.31)
    or a bootstrap kubeconfig with KubeletConfiguration and a systemd drop-in, labels and taints at
    registration, the containerd drop-in and the CDI spec; then C(kubeadm join) or a kubelet restart.
  - The bootstrap token is read on the node from the profile's C(token_file) (mode 0600). With
    O(token) the module first writes it there (0600, atomically, only when it differs), so the
    token file and the join cost one round trip; the token is a no_log argument, never in argv,
    and masked in every result and diff.
  - With O(dry_run) the files are written but no command runs. Check mode only plans.
  - A node whose kubelet.conf exists is not joined again.
  - O(state=absent) undoes what C(nodeprep join) wrote, as C(nodeprep uninstall) does for the join
    (C(nodeprep.join.removal.plan_removal) with the join's files) - the runtime part, the kubeadm or
    kubelet files nodeprep wrote, and the kubelet enablement links the join's C(systemctl enable)
    made. The operator's profile, token file and CA certificate stay, and so does what kubeadm or
    the kubelet made (C(kubeadm reset)). Check mode lists what would go and changes nothing.
version_added: "0.1.0"
options:
  root:
    description: Root of the node's filesystem (V(/) or an image directory; commands are then deferred).
    type: path
    default: /
  dry_run:
    description: Write the files but run no command (no C(kubeadm join), no kubelet restart).
    type: bool
    default: false
  insecure_skip_ca_verification:
    description: Join without pinning the cluster CA.
    type: bool
    default: false
  skip_preflight:
    description: Skip the preflight checks (active driver, container runtime, swap, tools).
    type: bool
    default: false
  skip_discovery:
    description:
      - Do not check the token and CA pin against the API server before writing (offline images).
      - Without it a join that runs commands first checks them and fails without writing anything.
    type: bool
    default: false
  nvidia_smi_xml:
    description: Read GPU facts (labels, CDI) from this C(nvidia-smi -q -x) capture.
    type: path
  token:
    description: Bootstrap token to write to O(token_file) (mode 0600) first; empty when the file is there.
    type: str
    default: ""
  token_file:
    description: Where O(token) goes (as the node sees it, under O(root)); the profile's C(token_file).
    type: str
    default: /etc/nodeprep/bootstrap-token
extends_documentation_fragment:
  - nodeprep.fleet.nodeprep
  - nodeprep.fleet.nodeprep.node
  - nodeprep.fleet.nodeprep.section
"""

EXAMPLES = r"""
- name: Kube join | Join the cluster
  nodeprep.fleet.nodeprep_join:
    profile: /etc/nodeprep/node.yaml
"""

RETURN = r"""
preflight:
  description: >-
    What would make the real run refuse (doctor's findings, no active driver for the CDI spec yet), also
    shown as warnings; check mode does not fail on them.
  returned: check mode
  type: list
  elements: str
plan:
  description: The join plan without secrets (mode, kubeadm API, files, commands, labels, taints, warnings).
  returned: when O(state=present)
  type: dict
already_joined:
  description: The node had joined before (kubelet.conf exists).
  returned: when O(state=present)
  type: bool
commands:
  description: Commands that ran.
  returned: always
  type: list
  elements: list
removed:
  description: As RV(nodeprep.fleet.nodeprep_runtime#module:removed), the join's files included.
  returned: when O(state=absent)
  type: list
  elements: str
restored:
  description: As RV(nodeprep.fleet.nodeprep_runtime#module:restored), the same removal.
  returned: when O(state=absent)
  type: list
  elements: str
kept:
  description: As RV(nodeprep.fleet.nodeprep_runtime#module:kept), of the join's files too.
  returned: when O(state=absent)
  type: list
  elements: str
"""

from ansible_collections.nodeprep.fleet.plugins.module_utils.nodeprep_op_join import main

if __name__ == "__main__":
    main()
