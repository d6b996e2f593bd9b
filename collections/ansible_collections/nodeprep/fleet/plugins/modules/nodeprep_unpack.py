#!/usr/bin/python
# Copyright: nodeprep maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nodeprep_unpack
short_description: Unpack the nodeprep zipapp on a node into the directory the modules import from
description:
  - Extracts the zipapp (a zip file with a shebang line) into O(dest), replacing an older tree in one
    rename, so package data files are plain files and the library imports without zipimport.
  - C(changed) is true only when O(dest) was not unpacked from a zipapp with the same sha256.
  - Needs nothing but the node's Python (no unzip tool).
version_added: "0.1.0"
options:
  src:
    description: The zipapp on the node.
    type: path
    required: true
  dest:
    description: Directory to unpack into (replaced as a whole).
    type: path
    required: true
  wrapper:
    description: Also write this shell wrapper (mode 0755) that runs the unpacked CLI; empty for none.
    type: str
    default: ""
extends_documentation_fragment:
  - nodeprep.fleet.nodeprep.wrapper
  - nodeprep.fleet.nodeprep
"""

EXAMPLES = r"""
- name: Nodeprep install | Unpack the library
  nodeprep.fleet.nodeprep_unpack:
    src: /usr/local/lib/nodeprep/nodeprep.pyz
    dest: /usr/local/lib/nodeprep/lib
"""

RETURN = r"""
sha256:
  description: sha256 of the zipapp now unpacked in O(dest).
  returned: always
  type: str
"""

from ansible_collections.nodeprep.fleet.plugins.module_utils.nodeprep_op_unpack import main

if __name__ == "__main__":
    main()
