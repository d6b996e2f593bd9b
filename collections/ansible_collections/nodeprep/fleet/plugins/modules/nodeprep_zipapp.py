#!/usr/bin/python
# Copyright: nodeprep maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nodeprep_zipapp
short_description: Build nodeprep as a single-file, byte-reproducible zipapp
description:
  - Packs the C(nodeprep) Python package (and optionally vendored pure-Python dependencies) into
    a zipapp with fixed timestamps and sorted members, so the same sources give the same bytes.
  - Runs on the controller (an action plugin; nothing is sent to the host the task runs for, no
    delegation needed); the result is copied to nodes by the C(nodeprep_install) role.
  - C(changed) is true only when the zipapp at O(dest) did not exist or had different bytes.
version_added: "0.1.0"
options:
  src:
    description: Directory that contains the C(nodeprep) package directory (a source checkout).
    type: path
    required: true
  dest:
    description: Where to write the zipapp.
    type: path
    required: true
  vendor_dirs:
    description:
      - Directories of extra pure-Python packages to include (for example the output of
        C(pip install --target DIR PKG)). Their top-level entries are added beside C(nodeprep).
    type: list
    elements: path
    default: []
  interpreter:
    description: Interpreter written into the zipapp's shebang line.
    type: str
    default: /usr/bin/python3
extends_documentation_fragment:
  - nodeprep.fleet.nodeprep
"""

EXAMPLES = r"""
- name: Nodeprep | Build the zipapp on the controller
  nodeprep.fleet.nodeprep_zipapp:
    src: "{{ playbook_dir }}/.."
    dest: /var/cache/nodeprep/nodeprep.pyz
  run_once: true
"""

RETURN = r"""
dest:
  description: Path of the zipapp.
  returned: always
  type: str
  sample: /var/cache/nodeprep/nodeprep.pyz
sha256:
  description: sha256 of the zipapp that is (or in check mode would be) at O(dest).
  returned: always
  type: str
  sample: 5b1e...
members:
  description: Number of files packed.
  returned: always
  type: int
  sample: 42
"""

# The work happens on the controller, in the action plugin of the same name
# (plugins/action/nodeprep_zipapp.py); this file documents it, like ansible.builtin.template's.
from ansible_collections.nodeprep.fleet.plugins.module_utils.nodeprep_zipapp import (  # noqa: F401
    argument_spec,
    build,
)
