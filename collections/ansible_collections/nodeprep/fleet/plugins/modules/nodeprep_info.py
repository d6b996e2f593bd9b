#!/usr/bin/python
# Copyright: nodeprep maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nodeprep_info
short_description: Check that the nodeprep library imports on a node and report its version
description:
  - Imports nodeprep (from the zipapp the C(nodeprep_install) role installed) and each of its
    Python dependencies, and reports their versions. Fails, naming what is missing, when any
    of them cannot be imported. Never changes anything.
version_added: "0.1.0"
options:
  nodeprep_path:
    description: The nodeprep library on the node (the directory nodeprep_install unpacks, or a zipapp).
    type: path
    default: /usr/local/lib/nodeprep/lib
  root:
    description: Unused; accepted so every nodeprep module takes the same common options.
    type: path
    default: /
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
author:
  - nodeprep maintainers
"""

EXAMPLES = r"""
- name: Nodeprep | Check that the library imports
  nodeprep.fleet.nodeprep_info:
"""

RETURN = r"""
version:
  description: nodeprep's version.
  returned: success
  type: str
  sample: 0.1.0
dependencies:
  description: Version of each Python dependency as imported on the node.
  returned: success
  type: dict
  sample: {"yaml": "6.0", "zstandard": "0.20.0"}
"""

import importlib

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.nodeprep.fleet.plugins.module_utils.nodeprep_host import (
    COMMON_ARGUMENT_SPEC,
    import_nodeprep,
)

DEPENDENCIES = ("click", "yaml", "jinja2", "requests", "zstandard", "jsonschema", "tomli_w")


def argument_spec():
    return dict(COMMON_ARGUMENT_SPEC)


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    import_nodeprep(module, "nodeprep.cli")
    versions = {}
    missing = []
    for name in DEPENDENCIES:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            missing.append(name)
            continue
        versions[name] = str(getattr(mod, "__version__", getattr(mod, "VERSION", "?")))
    nodeprep = importlib.import_module("nodeprep")
    if missing:
        module.fail_json(
            msg="nodeprep dependencies missing on the node: " + ", ".join(missing), dependencies=versions
        )
    module.exit_json(changed=False, version=getattr(nodeprep, "__version__", "?"), dependencies=versions)


if __name__ == "__main__":
    main()
