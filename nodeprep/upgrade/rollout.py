"""A node's upgrade steps against the cluster: `prepare` (from the node's resume point through cordon,
wait for jobs, GPU pod eviction and the optional drain, up to pod-restart-required, where the node's
own work begins), `finish` (validation: the GPU self-test taint lifted; uncordon what the rollout
cordoned; upgrade-done), `fail` (upgrade-failed with the reason, left cordoned) and `status` (every
node's view, for plans and the failure budget). The state label is patched as each step finishes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import NodeprepError
from ..join.verification import FAILED as VERDICT_FAILED
from ..join.verification import expected_digest
from ..labels.core import VERIFIED_LABEL
from ..profile import UNVERIFIED_TAINT
from . import pods as podsel
from . import states as st
from .cluster import Cluster

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Options:
    timeout: float = 600.0  # eviction (a disruption budget refusing) and pods going, per node
    interval: float = 5.0  # between refused evictions
    full_drain: bool = False
    opt_out_label: str = podsel.OPT_OUT_LABEL
    wait_for_jobs: str | None = None  # a label selector of pods to wait for before evicting
    jobs_timeout: float = 0.0
    grace_seconds: int | None = None
    validation_timeout: float = 600.0
    require_selftest: bool = True


@dataclass
class Result:
    node: str
    state: str  # the state the node stands in now
    changed: bool = False
    check: bool = False
    lines: list[str] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "state": self.state,
            "changed": self.changed,
            "check": self.check,
            "lines": self.lines,
            "evicted": self.evicted,
            "kept": self.kept,
        }


def _record(
    c: Cluster, res: Result, state: str, target: str, *, check: bool, reason: str | None = None
) -> None:
    res.state = state
    res.changed = True
    if check:
        res.lines.append(f"would set {st.STATE_LABEL}={state}")
        return
    c.patch_node(res.node, st.state_patch(state, target, reason=reason))
    res.lines.append(f"{st.STATE_LABEL}={state}")


def prepare(c: Cluster, node: str, target: str, opts: Options = Options(), *, check: bool = False) -> Result:
    """Run the node's cluster steps before its own work, from where it stands; a node done or failed
    for `target` is left as it is. An eviction a budget blocks marks the node upgrade-failed (still
    cordoned) and raises."""
    v = st.view(c.node(node))
    point = st.resume_point(v, target)
    res = Result(node, point, check=check)
    if point == st.REQUIRED and (v.state != st.REQUIRED or v.target != target):
        _record(c, res, st.REQUIRED, target, check=check)
    for step in st.remaining(point):
        if step not in st.BEFORE_NODE:
            break
        if step == st.CORDON:
            patch = st.cordon_patch(v)
            if patch is None:
                res.lines.append(
                    "unschedulable already"
                    + (
                        " (cordoned by this rollout)"
                        if v.cordoned_by_rollout
                        else ": left as it is and not uncordoned afterwards"
                    )
                )
            elif check:
                res.lines.append("would cordon")
            else:
                c.patch_node(node, patch)
                res.lines.append("cordoned")
        elif step == st.WAIT_FOR_JOBS and opts.wait_for_jobs and not check:
            _wait_for_jobs(c, node, opts, res)
        elif step in (st.POD_DELETION, st.DRAIN):
            if step == st.DRAIN and not opts.full_drain:
                pass
            else:
                try:
                    _evict(c, node, opts, res, full=step == st.DRAIN, check=check)
                except NodeprepError as e:
                    if not check:
                        fail(c, node, target, str(e))
                    raise
        _record(c, res, st.next_state(step), target, check=check)
    return res


def _wait_for_jobs(c: Cluster, node: str, opts: Options, res: Result) -> None:
    deadline = c.clock() + opts.jobs_timeout
    while True:
        running = [
            p
            for p in c.pods_on(node, selector=opts.wait_for_jobs)
            if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ]
        if not running:
            res.lines.append(f"no pods matching {opts.wait_for_jobs} running")
            return
        if c.clock() >= deadline:
            res.lines.append(
                f"{len(running)} pod(s) matching {opts.wait_for_jobs} still running after "
                f"{opts.jobs_timeout:.0f}s: going on"
            )
            return
        c.sleep(min(opts.interval, 10.0))


def _evict(c: Cluster, node: str, opts: Options, res: Result, *, full: bool, check: bool) -> None:
    pods = c.pods_on(node)
    claims: dict[str, dict[str, Any]] = {}
    for ns in sorted(
        {
            str((p.get("metadata") or {}).get("namespace"))
            for p in pods
            if (p.get("spec") or {}).get("resourceClaims")
        }
    ):
        claims.update(c.resource_claims(ns))
    chosen = []
    for pod, d in zip(
        pods,
        podsel.to_evict(pods, claims=claims, full_drain=full, opt_out_label=opts.opt_out_label),
        strict=True,
    ):
        if not d.evict:
            if not full:
                res.kept.append(f"{d.namespace}/{d.name} ({d.why})")
            continue
        if check:
            res.lines.append(f"would evict {d.namespace}/{d.name} ({d.why})")
            res.evicted.append(f"{d.namespace}/{d.name}")
            continue
        res.lines.append(
            c.evict(pod, timeout=opts.timeout, interval=opts.interval, grace_seconds=opts.grace_seconds)
            + f" ({d.why})"
        )
        res.evicted.append(f"{d.namespace}/{d.name}")
        chosen.append(pod)
    if chosen:
        res.changed = True
        left = c.wait_gone(chosen, timeout=opts.timeout)
        if left:
            raise NodeprepError(
                f"evicted pod(s) still on node {node} after {opts.timeout:.0f}s: {', '.join(left)}"
            )


def validated(node: dict[str, Any], target: str) -> str | None:
    """Why the node's GPU self-test has not passed for `target` yet (None: the driver label is `target`,
    the verdict label is the digest of this boot and driver, and the unverified taint is off)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    label = labels.get(VERIFIED_LABEL)
    if label == VERDICT_FAILED:
        return f"the GPU self-test failed ({VERIFIED_LABEL}={VERDICT_FAILED})"
    if labels.get(st.DRIVER_LABEL) != target:
        return f"the node's {st.DRIVER_LABEL} label is {labels.get(st.DRIVER_LABEL)!r}, not {target}"
    if label is None or label != expected_digest(node):
        return f"no GPU self-test verdict for this boot and driver {target} ({VERIFIED_LABEL})"
    if any(t.get("key") == UNVERIFIED_TAINT.key for t in (node.get("spec") or {}).get("taints") or []):
        return f"the {UNVERIFIED_TAINT.key} taint is still on the node"
    return None


def finish(c: Cluster, node: str, target: str, opts: Options = Options(), *, check: bool = False) -> Result:
    """After the node's own work: validation (with `require_selftest`, the GPU self-test taint lifted
    within `validation_timeout`), uncordon (only what the rollout cordoned), upgrade-done."""
    v = st.view(c.node(node))
    point = st.resume_point(v, target)
    res = Result(node, point, check=check)
    if point in (st.DONE, st.FAILED):
        return res
    if check and point not in (st.POD_RESTART, *st.AFTER_NODE):  # planned as after a prepare
        res.lines.append("would validate" + (" (GPU self-test)" if opts.require_selftest else ""))
        if st.uncordon_patch(v) is not None or not v.unschedulable:
            res.lines.append("would uncordon")
        elif v.unschedulable:
            res.lines.append("would leave it cordoned: this rollout did not cordon it")
        _record(c, res, st.DONE, target, check=True)
        return res
    if point not in (st.POD_RESTART, *st.AFTER_NODE):
        raise NodeprepError(
            f"node {node} is in {point}: its cluster steps before the driver change have not "
            "finished (run nodeprep upgrade prepare first)"
        )
    if point == st.POD_RESTART:
        _record(c, res, st.VALIDATION, target, check=check)
        point = st.VALIDATION
    if point == st.VALIDATION:
        if opts.require_selftest and not check:
            deadline = c.clock() + opts.validation_timeout
            while (why := validated(now := c.node(node), target)) is not None:
                verdict = ((now.get("metadata") or {}).get("labels") or {}).get(VERIFIED_LABEL)
                if verdict == VERDICT_FAILED or c.clock() >= deadline:
                    raise NodeprepError(f"node {node}: validation failed: {why}")
                c.sleep(min(opts.interval, 5.0))
            res.lines.append("GPU self-test passed (taint lifted)")
        _record(c, res, st.UNCORDON, target, check=check)
    v = st.view(c.node(node)) if not check else v
    patch = st.uncordon_patch(v)
    if patch is None:
        if v.unschedulable:
            res.lines.append("left cordoned: this rollout did not cordon it")
    elif check:
        res.lines.append("would uncordon")
    else:
        c.patch_node(node, patch)
        res.lines.append("uncordoned")
    _record(c, res, st.DONE, target, check=check)
    return res


def fail(c: Cluster, node: str, target: str, reason: str, *, check: bool = False) -> Result:
    """upgrade-failed with `reason` in the annotation; the node stays cordoned."""
    v = st.view(c.node(node))
    res = Result(node, st.resume_point(v, target), check=check)
    reason = " ".join(reason.split())[:1000]
    if v.state == st.FAILED and v.target == target and v.reason == reason:
        return res
    _record(c, res, st.FAILED, target, check=check, reason=reason)
    return res


def status(c: Cluster, nodes: Sequence[str]) -> list[st.NodeView]:
    """The view of each named node (a node the cluster does not know is an error)."""
    return [st.view(c.node(n)) for n in nodes]


def mark_required(
    c: Cluster, views: Sequence[st.NodeView], names: Sequence[str], target: str, *, check: bool = False
) -> list[str]:
    """Label the planned nodes upgrade-required (those without a state for `target`)."""
    out = []
    wanted = set(names)
    for v in views:
        if v.name in wanted and (v.target != target or v.state not in st.STATES):
            if not check:
                c.patch_node(v.name, st.state_patch(st.REQUIRED, target))
            out.append(v.name)
    return out
