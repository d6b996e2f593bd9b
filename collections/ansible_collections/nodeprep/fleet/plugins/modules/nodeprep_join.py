#!/usr/bin/python
# Copyright: nodeprep maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nodeprep_join
short_description: Join a GPU node to Kubernetes with nodeprep (kubeadm or kubelet bootstrap)
description:
  - Reads the node profile's C(cluster) section and calls C(nodeprep.join.plan_join) then
    C(apply_join) - JoinConfiguration (v1beta3 below 1.31, v1beta4 from 1.31) or a bootstrap
    kubeconfig with KubeletConfiguration and a systemd drop-in, labels and taints at registration,
    the containerd drop-in and the CDI spec; then C(kubeadm join) or a kubelet restart.
  - The bootstrap token is read on the node from the profile's C(token_file) (mode 0600). With
    O(token) the module first writes it there (0600, atomically, only when it differs), so the
    token file and the join cost one round trip; the token is a no_log argument, never in argv,
    and masked in every result and diff.
  - With O(dry_run) the files are written but no command runs. Check mode only plans.
  - A node whose kubelet.conf exists is not joined again.
version_added: "0.1.0"
options:
  nodeprep_path:
    description: The nodeprep library on the node (the directory nodeprep_install unpacks, or a zipapp).
    type: path
    default: /usr/local/lib/nodeprep/lib
  root:
    description: Root of the node's filesystem (V(/) or an image directory; commands are then deferred).
    type: path
    default: /
  profile:
    description: The node profile (path as the node sees it, under O(root)).
    type: str
    default: /etc/nodeprep/node.yaml
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
- name: Kube join | Join the cluster
  nodeprep.fleet.nodeprep_join:
    profile: /etc/nodeprep/node.yaml
"""

RETURN = r"""
plan:
  description: The join plan without secrets (mode, kubeadm API, files, commands, labels, taints, warnings).
  returned: always
  type: dict
already_joined:
  description: The node had joined before (kubelet.conf exists).
  returned: always
  type: bool
commands:
  description: Commands that ran.
  returned: always
  type: list
  elements: list
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.nodeprep.fleet.plugins.module_utils.nodeprep_host import (
    COMMON_ARGUMENT_SPEC,
    change_diffs,
    fail_from,
    import_nodeprep,
    load_profile,
    nodeprep_errors,
    under_root,
    write_if_changed,
)


def argument_spec():
    spec = dict(COMMON_ARGUMENT_SPEC)
    spec.update(
        profile={"type": "str", "default": "/etc/nodeprep/node.yaml"},
        dry_run={"type": "bool", "default": False},
        insecure_skip_ca_verification={"type": "bool", "default": False},
        skip_preflight={"type": "bool", "default": False},
        nvidia_smi_xml={"type": "path"},
        token={"type": "str", "default": "", "no_log": True},
        token_file={"type": "str", "default": "/etc/nodeprep/bootstrap-token"},
    )
    return spec


def write_token(module, p):
    """Write O(token) to O(token_file) under O(root) (0600) when it differs; (changed, masked diffs)."""
    if not p["token"]:
        return False, []
    path = under_root(p["root"], p["token_file"])
    existed = os.path.exists(path)
    changed, _ = write_if_changed(module, path, p["token"].strip() + "\n", 0o600)
    if not changed:
        return False, []
    before = "(secret content not shown)\n" if existed else ""
    after = "(secret content not shown, sha256 changed)\n" if existed else "(secret)\n"
    return True, [{"before_header": path, "after_header": path, "before": before, "after": after}]


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    p = module.params
    plan_mod, profile_mod = import_nodeprep(module, "nodeprep.join.plan", "nodeprep.profile")
    from pathlib import Path

    token_changed, token_diffs = write_token(module, p)

    try:
        profile = load_profile(module, profile_mod, p["root"], p["profile"])
        options = plan_mod.JoinOptions(
            root=Path(p["root"]),
            insecure_skip_ca_verification=p["insecure_skip_ca_verification"],
            skip_preflight=p["skip_preflight"],
            nvidia_smi_xml=Path(p["nvidia_smi_xml"]) if p["nvidia_smi_xml"] else None,
        )
        plan = plan_mod.plan_join(profile, options)
        summary = plan.to_dict()
        diffs = change_diffs(plan.files)
        diffs = token_diffs + diffs
        changed = token_changed or any(f.changed for f in plan.files) or (not p["dry_run"] and plan.changed)
        commands = []
        if not module.check_mode:
            result = plan_mod.apply_join(plan, run=not p["dry_run"])
            changed = token_changed or result["changed"]
            commands = result["ran"]
    except nodeprep_errors(module) as e:
        fail_from(module, e)
    out = {"changed": changed, "plan": summary, "already_joined": plan.already_joined, "commands": commands}
    if module._diff:
        out["diff"] = diffs
    module.exit_json(**out)


if __name__ == "__main__":
    main()
