"""The runtime and join verbs, one use case each: configure the container runtime (containerd's
drop-in, the CDI spec, hooks.d) and join the cluster. `nodeprep runtime|join`, bootstrap's runtime
and join steps and nodeprep.fleet.nodeprep_runtime|nodeprep_join each make one request (the loaded,
typed profile plus what the verb adds) and call the same function, which owns the plan (the root's
files, beneath --root) and whether it is applied."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..profile import Profile
from .apply import apply_join, apply_runtime, preview_join
from .files import FileChange
from .plan import JoinOptions, JoinPlan, RuntimePlan, plan_join, plan_runtime
from .token import BootstrapToken


@dataclass(frozen=True)
class Seen:
    """A planned file as it was before the apply (a FileChange reads the node each time it is asked):
    what a front-end reports and diffs of an applied plan."""

    target: str
    content: bytes = field(repr=False)
    before: bytes | None = field(repr=False)
    secret: bool
    changed: bool
    described: Mapping[str, object]

    def summary(self) -> dict[str, object]:
        return dict(self.described)


def seen(files: Iterable[FileChange]) -> tuple[Seen, ...]:
    return tuple(Seen(f.target, f.content, f.before, f.secret, f.changed, f.summary()) for f in files)


@dataclass(frozen=True)
class RuntimeRequest:
    """Configure the runtime as the profile's `runtime` section says. `check`: the plan only.
    `nvidia_smi_xml`: GPU facts from a capture; `dev_root`: where the CDI spec's device nodes are
    looked up (None: the root). `skip_preflight`, `discovery` and `labels` as JoinOptions's."""

    profile: Profile
    check: bool = False
    nvidia_smi_xml: Path | None = None
    dev_root: Path | None = None
    skip_preflight: bool = False
    discovery: bool = True
    labels: Mapping[str, str] | None = None


@dataclass(frozen=True)
class RuntimeOutcome:
    """The runtime's plan, its files as they were before any write, and, unless check mode, what
    applying it did (apply_runtime's result)."""

    plan: RuntimePlan
    files: tuple[Seen, ...]
    applied: dict[str, Any] | None


def configure_runtime(root: Path, request: RuntimeRequest) -> RuntimeOutcome:
    """Plan the runtime configuration of the node at `root`; unless request.check, apply it."""
    plan = plan_runtime(request.profile, JoinOptions(
        root=root, nvidia_smi_xml=request.nvidia_smi_xml, labels=request.labels,
        skip_preflight=request.skip_preflight, check=request.check, discovery=request.discovery,
        dev_root=request.dev_root))
    before = seen(plan.files)
    return RuntimeOutcome(plan, before, None if request.check else apply_runtime(plan))


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
