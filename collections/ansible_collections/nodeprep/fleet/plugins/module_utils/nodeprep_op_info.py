# Copyright: nodeprep maintainers
# Apache-2.0
"""What nodeprep.fleet.nodeprep_info does on the node (its documentation is in
plugins/modules/nodeprep_info.py). Its entry point is main()."""

from __future__ import annotations

import os
import sys

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.nodeprep.fleet.plugins.module_utils import nodeprep_host as host

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
    return host.node_argument_spec(
        **host.PROFILE_ARGUMENT_SPEC,
        sha256={"type": "str", "default": ""},
        zipapp={"type": "str", "default": ""},
        wrapper={"type": "str", "default": ""},
        interpreter={"type": "str", "default": "/usr/bin/python3"},
        profile={"type": "dict", "default": {}},
        profile_path={"type": "str", "default": "/etc/nodeprep/node.yaml"},
    )


def files_current(module, p):
    """(installed sha256, whether the zipapp, its unpacked tree and the wrapper match p["sha256"])."""
    installed = host.read_stamp(p["nodeprep_path"])
    if installed != p["sha256"]:
        return installed, False
    if p["zipapp"]:
        try:
            if (os.stat(p["zipapp"]).st_mode & 0o7777) != 0o755 or module.sha256(p["zipapp"]) != p["sha256"]:
                return installed, False
        except OSError:
            return installed, False
    wrapper = host.wrapper_text(p["interpreter"], p["nodeprep_path"])
    if p["wrapper"] and not host.file_is(p["wrapper"], wrapper, 0o755):
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
        # by name on purpose: a probe, nodeprep may be missing on the host and that is reported in one line
        importlib.import_module("nodeprep.cli" if deep else "nodeprep")
    except ImportError as e:
        return {}, [e.name or "nodeprep"], f"nodeprep is not importable from {path}: {e}"
    import nodeprep  # the probe above found it

    found = os.path.realpath(nodeprep.__file__)
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
            # by name on purpose: a probe of each dependency in DEPENDENCIES, a missing one is reported
            mod = importlib.import_module(name)
        except ImportError:
            missing.append(name)
            continue
        versions[name] = dependency_version(name, mod)
    if missing:
        return versions, missing, "nodeprep dependencies missing on the node: " + ", ".join(missing)
    return versions, [], None


def profile_current(module, p):
    """The profile validates and the file already holds what nodeprep_profile would write."""
    from nodeprep.errors import NodeprepError
    from nodeprep.profile import parse_profile

    try:
        parse_profile(p["profile"], source=p["profile_path"],
                      insecure_skip_ca_verification=p["insecure_skip_ca_verification"])
    except NodeprepError:
        return False  # nodeprep_profile runs and reports every problem
    path = host.under_root(module, p["root"], p["profile_path"])
    return host.file_is(path, host.profile_text(p["profile"]), 0o644)


def run(module):
    """The nodeprep_info task on a validated AnsibleModule (see modules/nodeprep_info.py)."""
    p = module.params
    out = {"changed": False}
    current = None
    if p["sha256"]:
        out["installed_sha256"], current = files_current(module, p)
    versions, missing, error = import_problems(p["nodeprep_path"], deep=not p["sha256"])
    if current is not None:
        out["current"] = current and error is None
    if p["profile"]:
        out["profile_current"] = error is None and profile_current(module, p)
    if error:
        module.fail_json(msg=error, dependencies=versions, missing=missing, **out)
    import nodeprep

    if not p["sha256"]:
        out["dependencies"] = versions
    module.exit_json(version=getattr(nodeprep, "__version__", "?"), **out)


def main():
    run(AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True))
