#!/usr/bin/python
# Copyright: nodeprep maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nodeprep_info
short_description: Check that the nodeprep library imports on a node and whether its install is current
description:
  - Imports nodeprep (from the zipapp the C(nodeprep_install) role installed) and each of its
    Python dependencies, and reports their versions. Fails, naming what is missing, when any
    of them cannot be imported. Never changes anything.
  - With O(sha256) it is a probe instead and reports, in one round trip, whether the install is
    already current (C(current)) - the zipapp at O(zipapp), the tree unpacked from it and the
    O(wrapper) are exactly what C(copy) and C(nodeprep_unpack) would leave, the C(nodeprep)
    package there imports and every dependency is installed - and with O(profile) whether the
    profile file already holds what C(nodeprep_profile) would write (C(profile_current)), so the
    role can skip those tasks on a node where nothing would change. The probe only looks the
    dependencies up (it does not import them or the whole CLI, which costs a few hundred ms on
    every run); the full import check runs when the role (re)installs.
version_added: "0.1.0"
options:
  root:
    description: Root of the node's filesystem; O(profile_path) is looked up under it.
    type: path
    default: /
  sha256:
    description: sha256 of the zipapp the controller built; empty to skip the install check.
    type: str
    default: ""
  zipapp:
    description: The zipapp on the node that O(sha256) must match (mode 0755); empty to not check it.
    type: str
    default: ""
  wrapper:
    description: The CLI wrapper nodeprep_unpack writes, checked with O(interpreter); empty for none.
    type: str
    default: ""
  profile:
    description: Node profile the node should hold at O(profile_path); empty to skip that check.
    type: dict
    default: {}
  profile_path:
    description: Where the node profile is (under O(root)).
    type: str
    default: /etc/nodeprep/node.yaml
extends_documentation_fragment:
  - nodeprep.fleet.nodeprep.no_diff
  - nodeprep.fleet.nodeprep
  - nodeprep.fleet.nodeprep.node
  - nodeprep.fleet.nodeprep.profile
  - nodeprep.fleet.nodeprep.wrapper
"""

EXAMPLES = r"""
- name: Nodeprep | Check that the library imports
  nodeprep.fleet.nodeprep_info:

- name: Nodeprep | Check whether this zipapp is already installed
  nodeprep.fleet.nodeprep_info:
    sha256: "{{ zipapp.sha256 }}"
    zipapp: /usr/local/lib/nodeprep/nodeprep.pyz
    wrapper: /usr/local/bin/nodeprep
  register: probe
  failed_when: false
"""

RETURN = r"""
version:
  description: nodeprep's version.
  returned: success
  type: str
  sample: 0.1.0
dependencies:
  description: Version of each Python dependency as imported on the node.
  returned: success, without O(sha256)
  type: dict
  sample: {"yaml": "6.0", "zstandard": "0.20.0"}
installed_sha256:
  description: sha256 of the zipapp O(nodeprep_path) was unpacked from (null when none).
  returned: when O(sha256) is set
  type: str
current:
  description: The library imports and the zipapp, the unpacked tree and the wrapper match O(sha256).
  returned: when O(sha256) is set
  type: bool
profile_current:
  description: The profile file holds exactly the validated O(profile) with mode 0644.
  returned: when O(profile) is set
  type: bool
"""

from ansible_collections.nodeprep.fleet.plugins.module_utils.nodeprep_op_info import main

if __name__ == "__main__":
    main()
