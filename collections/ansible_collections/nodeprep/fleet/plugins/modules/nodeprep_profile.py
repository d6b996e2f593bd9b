#!/usr/bin/python
# Copyright: nodeprep maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nodeprep_profile
short_description: Validate a nodeprep node profile and write it to the node
description:
  - Validates O(content) with C(nodeprep.profile.parse_profile) (every problem reported at once, one
    per field, named by its C(section.key) path) and writes it as YAML, the same file cloud-init
    writes and every node-side nodeprep command reads.
  - C(changed) is true only when the file's content or mode differs.
version_added: "0.1.0"
options:
  root:
    description: Root of the node's filesystem; O(path) is written under it.
    type: path
    default: /
  content:
    description: The profile (sections driver, labels, cluster, runtime), as in C(examples/node.yaml).
    type: dict
    required: true
  path:
    description: Where the profile goes on the node.
    type: str
    default: /etc/nodeprep/node.yaml
extends_documentation_fragment:
  - nodeprep.fleet.nodeprep
  - nodeprep.fleet.nodeprep.node
  - nodeprep.fleet.nodeprep.profile
"""

EXAMPLES = r"""
- name: Nodeprep | Write the node profile
  nodeprep.fleet.nodeprep_profile:
    content:
      driver:
        version: "535.309.01"
        store: https://artifacts.example.com/nvidia
"""

RETURN = r"""
path:
  description: The profile's path on the node.
  returned: always
  type: str
profile:
  description: The validated profile with every default filled in.
  returned: success
  type: dict
"""

from ansible_collections.nodeprep.fleet.plugins.module_utils.nodeprep_op_profile import main

if __name__ == "__main__":
    main()
