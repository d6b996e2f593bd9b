"""Apply a join plan (nodeprep.join.joinplan): write its files atomically, run its commands.

`apply_join(plan, run=...)` for a join (the runtime's part: nodeprep.runtime.configure) (the token and CA
first checked against the cluster), `preview_join(plan, output_dir)` for a dry run (nothing on the
node; the files under DIR when asked), `join(profile, options)` plans and applies.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..errors import StateError
from ..log import step
from ..profile import Profile
from ..runtime.configure import run_actions
from ..runtime.files import apply_changes, relocated
from .discovery import discover
from .joinplan import JoinOptions, JoinPlan, plan_join

log = logging.getLogger(__name__)


def apply_join(plan: JoinPlan, *, run: bool = True) -> dict[str, Any]:
    """Write the planned files; then run the planned commands unless `run` is False (--dry-run).
    Refuses (StateError) when preflight found problems; with `run`, first checks the token and CA
    against the cluster (nodeprep.join.discovery) and refuses (one line, nothing written) when they
    do not hold."""
    if plan.preflight:
        raise StateError(
            "preflight failed: " + "; ".join(plan.preflight),
            hint="fix it (nodeprep doctor) or pass --skip-preflight",
        )
    result = plan.to_dict()  # before writing: `changed` describes what this apply does
    if run and plan.discovery is not None:
        with step(f"check token and CA against {plan.discovery.api_server}", logger=log):
            info = discover(plan.discovery, plan.token)
        result["discovery"] = {"server": info.server, "ca_pin": info.ca_pin}
    written = apply_changes(list(plan.files))
    ran = run_actions(plan.actions) if run else []
    result.update(
        {
            "written": [f.target for f in written],
            "ran": [list(a.argv) for a in ran],
            "changed": bool(written) or bool(ran),
        }
    )
    return result


def preview_join(plan: JoinPlan, output_dir: Path | None = None) -> dict[str, Any]:
    """A dry run: the plan's summary; nothing on the node is written and nothing runs. With
    `output_dir`, the files are written under that directory (as they would lie under the root).
    Preflight findings are part of the plan (`preflight`), not a refusal: a plan can be shown on any
    machine; only apply_join refuses."""
    result = plan.to_dict()
    placed = relocated(list(plan.files), output_dir) if output_dir is not None else []
    apply_changes(placed)
    result.update({"written": [], "ran": [], "preview": [str(f.path) for f in placed]})
    return result


def join(
    profile: Profile, options: JoinOptions | None = None, *, dry_run: bool = False
) -> tuple[JoinPlan, dict[str, Any]]:
    """plan_join + apply_join: the whole `nodeprep join`."""
    plan = plan_join(profile, options)
    return plan, apply_join(plan, run=not dry_run)
