#!/usr/bin/python
# Copyright: nodeprep maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nodeprep_runtime
short_description: Configure containerd for NVIDIA GPUs (drop-in, nvidia runtime, CDI spec) with nodeprep
description:
  - Reads the node profile's C(runtime) section and calls C(nodeprep.join.plan_runtime) then
    C(apply_runtime) - a containerd drop-in (plus one C(imports) entry in the main config) and the CDI
    spec pointing at the active driver root.
  - Check mode calls only the plan; C(changed) and the diff come from comparing each rendered file
    with the one on disk.
version_added: "0.1.0"
options:
  nodeprep_path:
    description: The nodeprep library on the node (the directory nodeprep_install unpacks, or a zipapp).
    type: path
    default: /usr/local/lib/nodeprep/lib
  root:
    description: Root of the node's filesystem (V(/) or an image directory).
    type: path
    default: /
  profile:
    description: The node profile (path as the node sees it, under O(root)).
    type: str
    default: /etc/nodeprep/node.yaml
  nvidia_smi_xml:
    description: Read the GPU list for the CDI spec from this C(nvidia-smi -q -x) capture.
    type: path
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
- name: Container runtime | Configure containerd for NVIDIA GPUs
  nodeprep.fleet.nodeprep_runtime:
"""

RETURN = r"""
files:
  description: Every planned file (path, mode, changed, sha256).
  returned: always
  type: list
  elements: dict
commands:
  description: Commands run (or that would run) after writing, such as a containerd restart.
  returned: always
  type: list
  elements: list
warnings_seen:
  description: What the plan warned about.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.nodeprep.fleet.plugins.module_utils.nodeprep_host import (
    COMMON_ARGUMENT_SPEC,
    change_diffs,
    fail_from,
    import_nodeprep,
    load_profile,
    nodeprep_errors,
)


def argument_spec():
    spec = dict(COMMON_ARGUMENT_SPEC)
    spec.update(
        profile={"type": "str", "default": "/etc/nodeprep/node.yaml"},
        nvidia_smi_xml={"type": "path"},
    )
    return spec


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    p = module.params
    plan_mod, profile_mod = import_nodeprep(module, "nodeprep.join.plan", "nodeprep.profile")
    from pathlib import Path

    try:
        profile = load_profile(module, profile_mod, p["root"], p["profile"])
        options = plan_mod.JoinOptions(
            root=Path(p["root"]), nvidia_smi_xml=Path(p["nvidia_smi_xml"]) if p["nvidia_smi_xml"] else None
        )
        plan = plan_mod.plan_runtime(profile, options)
        files = [f.summary() for f in plan.files]
        diffs = change_diffs(plan.files)
        commands = [list(a.argv) for a in plan.actions if not a.deferred]
        changed = plan.changed
        if not module.check_mode:
            result = plan_mod.apply_runtime(plan)
            changed = result["changed"]
            commands = result["ran"]
    except nodeprep_errors(module) as e:
        fail_from(module, e)
    out = {"changed": changed, "files": files, "commands": commands, "warnings_seen": list(plan.warnings)}
    if module._diff:
        out["diff"] = diffs
    module.exit_json(**out)


if __name__ == "__main__":
    main()
