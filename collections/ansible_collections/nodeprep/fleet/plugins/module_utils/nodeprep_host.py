# Copyright: nodeprep maintainers
# Apache-2.0
"""Glue shared by the nodeprep modules: find and import the library, translate its errors."""

from __future__ import annotations

import importlib
import sys
import traceback

from ansible.module_utils.basic import missing_required_lib

DEFAULT_NODEPREP_PATH = "/usr/local/lib/nodeprep/nodeprep.pyz"

# Options every node-side module accepts.
COMMON_ARGUMENT_SPEC = {
    "nodeprep_path": {"type": "path", "default": DEFAULT_NODEPREP_PATH},
    "root": {"type": "path", "default": "/"},
}


def import_nodeprep(module, *names):
    """Import nodeprep submodules (from the zipapp at nodeprep_path, or an installed package).

    Fails the module with missing_required_lib when the library (or one of its dependencies) is
    missing, so the message names what to install instead of showing a bare traceback.
    """
    path = module.params.get("nodeprep_path")
    if path and path not in sys.path:
        sys.path.insert(0, path)
    try:
        importlib.import_module("nodeprep")
        return [importlib.import_module(name) for name in names]
    except ImportError as e:
        module.fail_json(
            msg=missing_required_lib(
                "nodeprep (" + (e.name or str(e)) + ")",
                reason="the nodeprep_install role puts it on the node; its dependencies come from the "
                       "OS packages listed in nodeprep_install_packages",
            ),
            exception=traceback.format_exc(),
        )
    return []  # not reached


def fail_from(module, exc, **result):
    """Report a library error as a module failure: one line, the hint and the exit code kept apart."""
    details = {"error_type": type(exc).__name__}
    hint = getattr(exc, "hint", None)
    if hint:
        details["hint"] = hint
    if hasattr(exc, "exit_code"):
        details["exit_code"] = exc.exit_code
    if hasattr(exc, "problems"):
        details["problems"] = list(exc.problems)
    module.fail_json(msg=str(exc), **details, **result)


def nodeprep_errors(module):
    """The library's base error class (import after import_nodeprep)."""
    return importlib.import_module("nodeprep.errors").NodeprepError
