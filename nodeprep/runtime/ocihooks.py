"""The CUDA gate's OCI hook for podman and CRI-O: one file in hooks.d (hook schema 1.0.0).

Both read /usr/share/containers/oci/hooks.d (CRI-O's only default `hooks_dir`; podman also reads
/etc/containers/oci/hooks.d, where a file of the same name would override this one). The hook runs
nodeprep.containerhooks.gate for every container (`when: {always: true}`: a hook's `when` cannot test
devices) at the createContainer stage, in the container's mount namespace before pivot_root, like
the CDI spec's own hook; the gate itself exits at once for a container without an NVIDIA GPU.
The hook is the program the CDI spec's hook is (hookprogram.py), started as the gate: it is written
with the hooks.d file, and the node's python3 is checked the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..containerhooks import gate
from ..errors import StateError
from .files import FileChange, under
from .hookprogram import hook_command, hook_program, python_problem

HOOKS_DIR = "/usr/share/containers/oci/hooks.d"
HOOK_NAME = "99-nodeprep-cuda-gate.json"
GATE_ENTRY = "gate"  # hookprogram.ENTRIES
STAGE = "createContainer"


def gate_hook() -> dict[str, Any]:
    """The OCI hook (path, args) running the gate with the node's default facts locations."""
    path, argv, env = hook_command(GATE_ENTRY)
    hook: dict[str, Any] = {"path": path,
                            "args": [*argv, "--driver-root", gate.DRIVER_ROOT, "--facts", gate.FACTS]}
    return {**hook, "env": env} if env else hook


def render_hooks_d() -> bytes:
    """The hooks.d file's bytes (pure given this interpreter and nodeprep's location)."""
    doc = {"version": "1.0.0", "hook": gate_hook(), "when": {"always": True}, "stages": [STAGE]}
    return (json.dumps(doc, indent=2) + "\n").encode()


def plan_hooks_d(root: Path) -> list[FileChange]:
    """The hook program and the hooks.d file naming it (StateError when the node's python3 cannot
    run it: a hook every container runs must not be written then)."""
    problem = python_problem(root)
    if problem:
        raise StateError(problem, hint="install python3 on the node (the image), or set runtime.cdi and "
                         "runtime.nvidia_runtime false; nothing was changed")
    target = f"{HOOKS_DIR}/{HOOK_NAME}"
    return [*hook_program(root), FileChange(under(root, target), target, render_hooks_d(), 0o644)]
