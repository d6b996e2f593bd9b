# Copyright: nodeprep maintainers
# Apache-2.0
"""Glue shared by the nodeprep modules: find and import the library, translate its errors."""

from __future__ import annotations

import importlib
import os
import stat
import sys
import traceback

from ansible.module_utils.basic import missing_required_lib

DEFAULT_NODEPREP_PATH = "/usr/local/lib/nodeprep/lib"

# Options every node-side module accepts.
COMMON_ARGUMENT_SPEC = {
    "nodeprep_path": {"type": "path", "default": DEFAULT_NODEPREP_PATH},
    "root": {"type": "path", "default": "/"},
}


# Options of every module that validates the node profile (doc fragment nodeprep.fleet.nodeprep.profile):
# the one opt-out of the CA pin rule, `nodeprep join --insecure-skip-ca-verification`.
PROFILE_ARGUMENT_SPEC = {
    "insecure_skip_ca_verification": {"type": "bool", "default": False},
}


# Options of the modules that apply one section of the node profile file and, with state=absent,
# remove what it wrote (doc fragment nodeprep.fleet.nodeprep.section): nodeprep_runtime, nodeprep_join.
SECTION_ARGUMENT_SPEC = {
    "profile": {"type": "str", "default": "/etc/nodeprep/node.yaml"},
    "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
}


def node_argument_spec(**options):
    """A node-side module's argument_spec: COMMON_ARGUMENT_SPEC plus its own options."""
    return {**COMMON_ARGUMENT_SPEC, **options}


def import_nodeprep(module, *names):
    """Import nodeprep submodules (from the zipapp at nodeprep_path, or an installed package).

    Fails the module with missing_required_lib when the library (or one of its dependencies) is
    missing, so the message names what to install instead of showing a bare traceback. In check
    mode a node without the library yet (nodeprep_install did not really run) reports changed.
    """
    path = module.params.get("nodeprep_path")
    if path and path not in sys.path:
        sys.path.insert(0, path)
    try:
        # by name on purpose: a probe, nodeprep may be missing on the host and that is reported in one line
        importlib.import_module("nodeprep")
        return [importlib.import_module(name) for name in names]  # the caller's list; same probe
    except ImportError as e:
        if module.check_mode:
            # a fresh node in a check-mode run: nodeprep_install would have put the library here
            module.exit_json(
                changed=True,
                msg=f"nodeprep is not importable from {path} yet ({e}); "
                "in check mode everything this module manages would change",
            )
        module.fail_json(
            msg=missing_required_lib(
                "nodeprep (" + (e.name or str(e)) + ")",
                reason="the nodeprep_install role puts it on the node; its dependencies come from the "
                "OS packages listed in nodeprep_install_packages",
            ),
            exception=traceback.format_exc(),
        )
    return []  # not reached


# The stamp nodeprep_unpack leaves in the unpacked tree: the sha256 of the zipapp it came from.
ZIPAPP_STAMP = ".zipapp-sha256"

PROFILE_HEADER = (
    "# nodeprep node profile, written by Ansible (role nodeprep_install). See examples/node.yaml.\n"
)


def wrapper_text(interpreter, dest):
    """The shell wrapper that puts the unpacked CLI on PATH."""
    return (
        f'#!/bin/sh\n# Written by Ansible (nodeprep.fleet.nodeprep_unpack).\nexec {interpreter} {dest} "$@"\n'
    )


def profile_text(content):
    """The node profile file nodeprep_profile writes for `content` (a dict)."""
    import yaml

    return PROFILE_HEADER + yaml.safe_dump(content, sort_keys=True, default_flow_style=False)


def read_stamp(dest):
    """sha256 of the zipapp `dest` was unpacked from, or None."""
    try:
        with open(os.path.join(dest, ZIPAPP_STAMP), encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return None


def file_is(path, content, mode):
    """True when `path` holds exactly `content` (text) with permission bits `mode`."""
    try:
        return read_text(path) == content and (os.stat(path).st_mode & 0o7777) == mode
    except (OSError, UnicodeDecodeError):
        return False


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
    # Ansible users have no flags: an input error names its profile field (driver.version), not --driver
    msg = exc.field_message() if hasattr(exc, "field_message") else str(exc)
    module.fail_json(msg=msg, **details, **result)


def nodeprep_errors(module):
    """The library's base error class (import after import_nodeprep)."""
    from nodeprep.errors import NodeprepError

    return NodeprepError


def under_root(module, root, path):
    """`path` (absolute, as seen on the node) inside `root`, the image's links resolved beneath it as
    on the booted node, never out of it (nodeprep.rootpath.beneath; call after import_nodeprep).
    Links that cannot be resolved (a loop, a file used as a directory) fail the module with one
    message naming the path, wherever it is called."""
    from nodeprep.rootpath import beneath

    try:
        return str(beneath(root or "/", str(path)))
    except nodeprep_errors(module) as e:
        fail_from(module, e, path=str(path))
    return None  # not reached


def read_text(path):
    """The text of the regular file `path`; None when there is none. Anything else there (a FIFO
    planted in an image, a device, a directory) reads as no file: never a blocking open."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    with os.fdopen(fd, encoding="utf-8", errors="replace") as f:  # bytes that are not text never match
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return f.read()


def write_if_changed(module, path, content, mode=0o644):
    """Write `content` to `path` when it differs (not in check mode), with nodeprep's one atomic
    writer (nodeprep.atomicfile.atomic_write: created with `mode`, fsynced, renamed, directory
    fsynced; a link at `path` replaced, never followed). The library must be importable (after
    import_nodeprep, or nodeprep_unpack's freshly unpacked tree).

    Returns (changed, diff) with the diff in Ansible's before/after form.
    """
    before = read_text(path)
    changed = os.path.islink(path) or not file_is(path, content, mode)  # a link is replaced
    diff = {"before_header": path, "after_header": path, "before": before or "", "after": content}
    if changed and not module.check_mode:
        from pathlib import Path

        from nodeprep.atomicfile import atomic_write

        try:
            atomic_write(Path(path), content, mode=mode)
        except OSError as e:
            module.fail_json(msg=f"cannot write {path}: {e.strerror or e}")
    return changed, diff


def change_diffs(files):
    """Ansible diffs for the library's planned FileChange objects (secret files never shown)."""
    diffs = []
    for f in files:
        if not f.changed:
            continue
        if f.secret:
            before = "" if f.before is None else "(secret content not shown)\n"
            after = "(secret content not shown, sha256 changed)\n" if f.before is not None else "(secret)\n"
        else:
            before = "" if f.before is None else f.before.decode("utf-8", "replace")
            after = f.content.decode("utf-8", "replace")
        diffs.append({"before_header": f.target, "after_header": f.target, "before": before, "after": after})
    return diffs


def doctor_problems(doctor_mod, root, checks, require_cuda, expect_version):
    """Run the library's doctor on `root`, its container hook audit included: (problems as
    "check: message", checks as dicts, active)."""
    from nodeprep.runtime.hookaudit import inheriting_hooks

    report = doctor_mod.doctor(
        root,
        require_cuda=require_cuda or None,
        checks=set(checks) or None,
        expect_version=expect_version or None,
        inheriting_hooks=inheriting_hooks,
    )
    problems = [f"{c.name}: {c.message}" for c in report.problems()]
    return problems, report.to_dict().get("checks", []), report.active


def report_findings(module, findings):
    """Check mode: what would stop the real run, shown as warnings (the task does not fail)."""
    for finding in findings:
        module.warn(f"preflight (the real run refuses): {finding}")
    return list(findings)


def exit_with(module, out, diffs, preflight=None):
    """End the task with the result `out`; in diff mode with `diffs` (Ansible's before/after form)
    as its diff, in check mode with `preflight` (what the real run refuses on, also shown as
    warnings) when the module reports one."""
    if preflight is not None and module.check_mode:
        out["preflight"] = report_findings(module, preflight)
    if module._diff:
        out["diff"] = diffs
    module.exit_json(**out)


def load_profile(module, profile_mod, root, path, **options):
    """The node profile at `path` (as the node sees it, under `root`); `options` go to
    nodeprep.profile.load_profile (insecure_skip_ca_verification)."""
    from pathlib import Path

    return profile_mod.load_profile(Path(under_root(module, root, path)), **options)
