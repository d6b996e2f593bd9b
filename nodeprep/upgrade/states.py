"""The per-node upgrade state (pure): NVIDIA GPU Operator's state names under nodeprep's own label key.

The state label is written as each step finishes, so `kubectl get nodes -L nodeprep.dev/upgrade-state`
shows a rollout and a re-run resumes where each node stopped. Annotations beside it: the version the
state refers to (a state of another version is a new rollout), who cordoned (the rollout uncordons only
a node it cordoned itself) and why a node failed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InputError

STATE_LABEL = "nodeprep.dev/upgrade-state"
TARGET_ANNOTATION = "nodeprep.dev/upgrade-target"  # the driver version the state label refers to
CORDONED_ANNOTATION = "nodeprep.dev/upgrade-cordoned"  # "true": this rollout made the node unschedulable
REASON_ANNOTATION = "nodeprep.dev/upgrade-reason"  # why the node is upgrade-failed
DRIVER_LABEL = "nodeprep.dev/driver-version"

REQUIRED = "upgrade-required"
CORDON = "cordon-required"
WAIT_FOR_JOBS = "wait-for-jobs-required"
POD_DELETION = "pod-deletion-required"
DRAIN = "drain-required"
POD_RESTART = "pod-restart-required"  # nodeprep: the driver is installed and reloaded (or rebooted) here
VALIDATION = "validation-required"
UNCORDON = "uncordon-required"
DONE = "upgrade-done"
FAILED = "upgrade-failed"

# The steps in order; every one but the last two is a state a node waits in until its step is done.
STEPS = (REQUIRED, CORDON, WAIT_FOR_JOBS, POD_DELETION, DRAIN, POD_RESTART, VALIDATION, UNCORDON)
STATES = (*STEPS, DONE, FAILED)
# The steps of the cluster side before the node's own work, and after it.
BEFORE_NODE = (REQUIRED, CORDON, WAIT_FOR_JOBS, POD_DELETION, DRAIN)
AFTER_NODE = (VALIDATION, UNCORDON)


@dataclass(frozen=True)
class NodeView:
    """What the rollout reads of one Node."""

    name: str
    state: str | None  # the label's value (None: no label)
    target: str | None  # the version annotation's value
    driver: str | None  # the driver-version label
    unschedulable: bool
    cordoned_by_rollout: bool
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.name,
            "state": self.state,
            "target": self.target,
            "driver": self.driver,
            "unschedulable": self.unschedulable,
            "cordoned_by_rollout": self.cordoned_by_rollout,
            "reason": self.reason,
        }


def view(node: Mapping[str, Any]) -> NodeView:
    """The NodeView of a Node object (pure)."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    notes = meta.get("annotations") or {}
    state = labels.get(STATE_LABEL)
    return NodeView(
        name=str(meta.get("name") or ""),
        state=str(state) if state is not None else None,
        target=notes.get(TARGET_ANNOTATION),
        driver=labels.get(DRIVER_LABEL),
        unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
        cordoned_by_rollout=notes.get(CORDONED_ANNOTATION) == "true",
        reason=notes.get(REASON_ANNOTATION),
    )


def resume_point(node: NodeView, target: str) -> str:
    """The state this node's rollout to `target` stands in: the step to run next, DONE or FAILED.

    A state recorded for another version (or none, or a value nodeprep does not write) starts over at
    upgrade-required; a node already failed for this version stays failed until its label is removed."""
    if node.target != target or node.state not in STATES:
        return REQUIRED
    return node.state


def remaining(state: str) -> tuple[str, ...]:
    """The steps from `state` on (none for DONE and FAILED)."""
    if state not in STATES:
        raise InputError(f"{state!r} is not an upgrade state ({', '.join(STATES)})")
    return STEPS[STEPS.index(state) :] if state in STEPS else ()


def next_state(state: str) -> str:
    """The state after `state`'s step has finished."""
    if state not in STEPS:
        raise InputError(f"{state!r} has no next step")
    i = STEPS.index(state)
    return STEPS[i + 1] if i + 1 < len(STEPS) else DONE


def state_patch(state: str, target: str, *, reason: str | None = None) -> dict[str, Any]:
    """The merge patch recording `state` for `target` (the reason annotation set for FAILED, cleared
    otherwise)."""
    if state not in STATES:
        raise InputError(f"{state!r} is not an upgrade state ({', '.join(STATES)})")
    return {
        "metadata": {
            "labels": {STATE_LABEL: state},
            "annotations": {
                TARGET_ANNOTATION: target,
                REASON_ANNOTATION: (reason or "unknown") if state == FAILED else None,
            },
        }
    }


def cordon_patch(node: NodeView) -> dict[str, Any] | None:
    """Cordon the node and record that the rollout did; None when it is unschedulable already (then
    someone else cordoned it, or this rollout did before, and the record stays as it is)."""
    if node.unschedulable:
        return None
    return {"spec": {"unschedulable": True}, "metadata": {"annotations": {CORDONED_ANNOTATION: "true"}}}


def uncordon_patch(node: NodeView) -> dict[str, Any] | None:
    """Uncordon only a node the rollout cordoned (and drop the record); None otherwise: a node cordoned
    by someone else stays cordoned."""
    if not node.cordoned_by_rollout:
        return None
    patch: dict[str, Any] = {"metadata": {"annotations": {CORDONED_ANNOTATION: None}}}
    if node.unschedulable:
        patch["spec"] = {"unschedulable": None}
    return patch
