#!/usr/bin/python
# Copyright: nodeprep maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nodeprep_runtime
short_description: Configure containerd for NVIDIA GPUs (drop-in, nvidia runtime, CDI spec) with nodeprep
description:
  - Reads the node profile's C(runtime) section and calls C(nodeprep.runtime.plan.plan_runtime) then
    C(nodeprep.runtime.configure.apply_runtime) - a containerd drop-in (plus one C(imports) entry in the main
    config) and the CDI spec pointing at the active driver root.
  - Check mode calls only the plan; C(changed) and the diff come from comparing each rendered file
    with the one on disk.
  - O(state=absent) undoes what C(nodeprep runtime) wrote (C(nodeprep.join.removal)), the runtime part
    of C(nodeprep uninstall). The drop-in and CDI specs nodeprep wrote are removed, and the imports entry
    is taken out of the containerd main file again. A file at those paths that nodeprep did not
    write is left and named in a warning.
version_added: "0.1.0"
options:
  root:
    description: Root of the node's filesystem (V(/) or an image directory).
    type: path
    default: /
  nvidia_smi_xml:
    description: Read the GPU list for the CDI spec from this C(nvidia-smi -q -x) capture.
    type: path
extends_documentation_fragment:
  - nodeprep.fleet.nodeprep
  - nodeprep.fleet.nodeprep.node
  - nodeprep.fleet.nodeprep.profile
  - nodeprep.fleet.nodeprep.section
"""

EXAMPLES = r"""
- name: Container runtime | Configure containerd for NVIDIA GPUs
  nodeprep.fleet.nodeprep_runtime:
"""

RETURN = r"""
preflight:
  description: >-
    What would make the real run refuse (no active driver for the CDI spec yet), also shown as warnings;
    check mode does not fail on them.
  returned: check mode
  type: list
  elements: str
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
removed:
  description:
    - Node paths removed (check mode, that would be removed), with O(state=absent).
    - The files, then the folders they leave empty that are not the distribution's (as C(nodeprep uninstall)).
  returned: when O(state=absent)
  type: list
  elements: str
restored:
  description: Node paths written back (the containerd main file), with O(state=absent).
  returned: when O(state=absent)
  type: list
  elements: str
kept:
  description: Files at those paths nodeprep did not write, left in place (also warnings).
  returned: when O(state=absent)
  type: list
  elements: str
warnings_seen:
  description: What the plan warned about.
  returned: always
  type: list
  elements: str
"""

from ansible_collections.nodeprep.fleet.plugins.module_utils.nodeprep_op_runtime import main

if __name__ == "__main__":
    main()
