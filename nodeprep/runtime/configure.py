"""The runtime verb: configure the container runtime (containerd's drop-in, the CDI spec, hooks.d).
`nodeprep runtime`, bootstrap's runtime step and nodeprep.fleet.nodeprep_runtime each make one
request (the loaded, typed profile plus what the verb adds) and call configure_runtime, which owns the
plan (the root's files, beneath --root) and whether it is applied; apply_runtime writes a plan's
files atomically and runs its commands (run_actions, which a join's apply runs too)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import runner
from ..errors import StateError
from ..log import step
from ..profile import Profile
from .files import Seen, apply_changes, seen
from .plan import Action, RuntimeOptions, RuntimePlan, plan_runtime

log = logging.getLogger(__name__)


def apply_runtime(plan: RuntimePlan) -> dict[str, Any]:
    if plan.preflight:
        raise StateError("; ".join(plan.preflight), hint="a check plan is shown, never applied")
    written = apply_changes(list(plan.files))
    ran = run_actions(plan.actions)
    return {
        "changed": bool(written) or bool(ran),
        "written": [f.target for f in written],
        "ran": [list(a.argv) for a in ran],
        "warnings": list(plan.warnings),
    }


def run_actions(actions: tuple[Action, ...]) -> list[Action]:
    ran = []
    for a in actions:
        if a.deferred:
            continue
        with step(f"{a.why}: {a}", logger=log):
            runner.run(list(a.argv), timeout=900, capture=False)
        ran.append(a)
    return ran


@dataclass(frozen=True)
class RuntimeRequest:
    """Configure the runtime as the profile's `runtime` section says. `check`: the plan only.
    `nvidia_smi_xml`: GPU facts from a capture; `dev_root`: where the CDI spec's device nodes are
    looked up (None: the root)."""

    profile: Profile
    check: bool = False
    nvidia_smi_xml: Path | None = None
    dev_root: Path | None = None


@dataclass(frozen=True)
class RuntimeOutcome:
    """The runtime's plan, its files as they were before any write, and, unless check mode, what
    applying it did (apply_runtime's result)."""

    plan: RuntimePlan
    files: tuple[Seen, ...]
    applied: dict[str, Any] | None


def configure_runtime(root: Path, request: RuntimeRequest) -> RuntimeOutcome:
    """Plan the runtime configuration of the node at `root`; unless request.check, apply it."""
    plan = plan_runtime(request.profile, RuntimeOptions(
        root=root, nvidia_smi_xml=request.nvidia_smi_xml, check=request.check, dev_root=request.dev_root))
    before = seen(plan.files)
    return RuntimeOutcome(plan, before, None if request.check else apply_runtime(plan))
