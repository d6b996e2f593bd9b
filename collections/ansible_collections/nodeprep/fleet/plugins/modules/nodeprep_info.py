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
  nodeprep_path:
    description: The nodeprep library on the node (the directory nodeprep_install unpacks, or a zipapp).
    type: path
    default: /usr/local/lib/nodeprep/lib
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
  interpreter:
    description: Python interpreter the wrapper runs.
    type: str
    default: /usr/bin/python3
  profile:
    description: Node profile the node should hold at O(profile_path); empty to skip that check.
    type: dict
    default: {}
  profile_path:
    description: Where the node profile is (under O(root)).
    type: str
    default: /etc/nodeprep/node.yaml
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

import importlib
import os
import sys

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.nodeprep.fleet.plugins.module_utils.nodeprep_host import (
    COMMON_ARGUMENT_SPEC,
    file_is,
    profile_text,
    read_stamp,
    under_root,
    wrapper_text,
)

# import name -> distribution name (versions come from the installed metadata: some packages,
# e.g. jsonschema, deprecate a __version__ attribute)
DEPENDENCIES = {
    "click": "click",
    "yaml": "PyYAML",
    "jinja2": "Jinja2",
    "requests": "requests",
    "zstandard": "zstandard",
    "jsonschema": "jsonschema",
    "tomli_w": "tomli_w",
}


def argument_spec():
    spec = dict(COMMON_ARGUMENT_SPEC)
    spec.update(
        sha256={"type": "str", "default": ""},
        zipapp={"type": "str", "default": ""},
        wrapper={"type": "str", "default": ""},
        interpreter={"type": "str", "default": "/usr/bin/python3"},
        profile={"type": "dict", "default": {}},
        profile_path={"type": "str", "default": "/etc/nodeprep/node.yaml"},
    )
    return spec


def files_current(module, p):
    """(installed sha256, whether the zipapp, its unpacked tree and the wrapper match p["sha256"])."""
    installed = read_stamp(p["nodeprep_path"])
    if installed != p["sha256"]:
        return installed, False
    if p["zipapp"]:
        try:
            if (os.stat(p["zipapp"]).st_mode & 0o7777) != 0o755 or module.sha256(p["zipapp"]) != p["sha256"]:
                return installed, False
        except OSError:
            return installed, False
    if p["wrapper"] and not file_is(p["wrapper"], wrapper_text(p["interpreter"], p["nodeprep_path"]), 0o755):
        return installed, False
    return installed, True


def dependency_version(name, module):
    """Version of an imported dependency: its distribution metadata, else its __version__."""
    import importlib.metadata

    try:
        return importlib.metadata.version(DEPENDENCIES[name])
    except importlib.metadata.PackageNotFoundError:  # vendored without metadata
        return str(getattr(module, "__version__", getattr(module, "VERSION", "?")))


def import_problems(path, deep=True):
    """(versions, missing names, error) for nodeprep and its dependencies at `path`.

    deep: import the whole CLI and every dependency and report versions; otherwise import only
    the nodeprep package and look the dependencies up (a missing one is found, nothing runs).
    """
    import importlib.util

    if path and path not in sys.path:
        sys.path.insert(0, path)
    try:
        importlib.import_module("nodeprep.cli" if deep else "nodeprep")
    except ImportError as e:
        return {}, [e.name or "nodeprep"], f"nodeprep is not importable from {path}: {e}"
    found = os.path.realpath(importlib.import_module("nodeprep").__file__)
    if path and not found.startswith(os.path.realpath(path).rstrip(os.sep) + os.sep):
        # another copy (a system package, a virtualenv) must not pass for the install at `path`
        return {}, ["nodeprep"], f"nodeprep is not installed at {path} (the one importable is {found})"
    versions, missing = {}, []
    for name in DEPENDENCIES:
        if not deep:
            if importlib.util.find_spec(name) is None:
                missing.append(name)
            continue
        try:
            mod = importlib.import_module(name)
        except ImportError:
            missing.append(name)
            continue
        versions[name] = dependency_version(name, mod)
    if missing:
        return versions, missing, "nodeprep dependencies missing on the node: " + ", ".join(missing)
    return versions, [], None


def profile_current(p):
    """The profile validates and the file already holds what nodeprep_profile would write."""
    profile_mod = importlib.import_module("nodeprep.profile")
    errors = importlib.import_module("nodeprep.errors")
    try:
        profile_mod.parse_profile(p["profile"], source=p["profile_path"])
    except errors.NodeprepError:
        return False  # nodeprep_profile runs and reports every problem
    return file_is(under_root(p["root"], p["profile_path"]), profile_text(p["profile"]), 0o644)


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    p = module.params
    out = {"changed": False}
    current = None
    if p["sha256"]:
        out["installed_sha256"], current = files_current(module, p)
    versions, missing, error = import_problems(p["nodeprep_path"], deep=not p["sha256"])
    if current is not None:
        out["current"] = current and error is None
    if p["profile"]:
        out["profile_current"] = error is None and profile_current(p)
    if error:
        module.fail_json(msg=error, dependencies=versions, missing=missing, **out)
    nodeprep = importlib.import_module("nodeprep")
    if not p["sha256"]:
        out["dependencies"] = versions
    module.exit_json(version=getattr(nodeprep, "__version__", "?"), **out)


if __name__ == "__main__":
    main()
