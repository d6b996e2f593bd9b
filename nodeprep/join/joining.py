"""The join verb's use case (the runtime's: nodeprep.runtime.configure): `nodeprep join`, bootstrap's
join step and nodeprep.fleet.nodeprep_join each make one request (the loaded, typed profile plus what
the verb adds) and call join_cluster, which owns the plan (the root's files, beneath --root) and
whether it is applied."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..profile import Profile
from ..runtime.files import Seen, seen
from .apply import apply_join, preview_join
from .joinplan import JoinOptions, JoinPlan, plan_join
from .token import BootstrapToken


@dataclass(frozen=True)
class JoinRequest:
    """Join as the profile's `cluster` section says. `check`: the plan (preview_join's result; with
    `output_dir` the files under it). `dry_run`: write the configuration, run nothing. `token`: a token
    not yet in cluster.token_file (a check-mode plan uses it). The rest as JoinOptions's."""

    profile: Profile
    check: bool = False
    dry_run: bool = False
    output_dir: Path | None = None
    insecure_skip_ca_verification: bool = False
    skip_preflight: bool = False
    discovery: bool = True
    discovery_timeout: float = 60.0
    nvidia_smi_xml: Path | None = None
    labels: Mapping[str, str] | None = None
    token: BootstrapToken | None = None


@dataclass(frozen=True)
class JoinOutcome:
    """The join's plan, its files and its summary (plan.to_dict()) as they were before any write, and
    its result: preview_join's (check mode) or apply_join's."""

    plan: JoinPlan
    files: tuple[Seen, ...]
    planned: dict[str, Any]
    result: dict[str, Any]


def join_cluster(root: Path, request: JoinRequest) -> JoinOutcome:
    """Plan the join of the node at `root`; with request.check its preview, else apply it (with
    request.dry_run the files alone)."""
    plan = plan_join(request.profile, JoinOptions(
        root=root, insecure_skip_ca_verification=request.insecure_skip_ca_verification,
        skip_preflight=request.skip_preflight, nvidia_smi_xml=request.nvidia_smi_xml,
        labels=request.labels, token=request.token, discovery=request.discovery,
        discovery_timeout=request.discovery_timeout, check=request.check))
    before, planned = seen(plan.files), plan.to_dict()
    if request.check:
        return JoinOutcome(plan, before, planned, preview_join(plan, request.output_dir))
    return JoinOutcome(plan, before, planned, apply_join(plan, run=not request.dry_run))
