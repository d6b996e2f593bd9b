"""Rollout policy (pure): batch size as a count or a percentage, max_unavailable across the fleet
(nodes already unschedulable count against it), and the failure budget.

The order: nodes a rollout already began (resumed where they stopped) first, then nodes that are
unschedulable anyway (upgrading them costs no capacity), then the rest in inventory order. Done nodes
and nodes failed for this version are left out. A batch holds at most `batch` nodes, and no more
newly unschedulable ones than `max_unavailable` leaves room for beside the fleet's other unschedulable
nodes (failed nodes stay cordoned, so they keep counting).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError
from .states import DONE, FAILED, REQUIRED, NodeView, resume_point

_SIZE = re.compile(r"\s*(\d{1,7})\s*(%?)\s*")


def parse_size(value: str | int, total: int, *, name: str) -> int:
    """A count ("3", 3) or a percentage of `total` ("5%": rounded down, at least 1)."""
    m = _SIZE.fullmatch(str(value))
    if not m:
        raise InputError(f"{value!r} is neither a count nor a percentage (e.g. 3 or 5%)", flag=name)
    n = int(m.group(1))
    if m.group(2):
        if not 0 < n <= 100:
            raise InputError(f"{value!r}: a percentage is 1% to 100%", flag=name)
        return max(1, math.floor(total * n / 100))
    if n < 1:
        raise InputError(f"{value!r}: at least 1", flag=name)
    return n


@dataclass(frozen=True)
class Plan:
    target: str
    batches: tuple[tuple[str, ...], ...]
    done: tuple[str, ...]
    failed: tuple[str, ...]
    blocked: tuple[str, ...]  # nodes no batch could take (max_unavailable used up)
    batch_size: int
    max_unavailable: int
    unavailable: tuple[str, ...]  # unschedulable nodes outside the rollout's work
    failure_budget: int
    notes: tuple[str, ...] = field(default=())

    @property
    def paused(self) -> bool:
        """The failure budget is spent already: the rollout does not start."""
        return len(self.failed) >= self.failure_budget

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "batch_size": self.batch_size,
            "max_unavailable": self.max_unavailable,
            "failure_budget": self.failure_budget,
            "batches": [list(b) for b in self.batches],
            "serial": [len(b) for b in self.batches],
            "order": [n for b in self.batches for n in b],
            "done": list(self.done),
            "failed": list(self.failed),
            "blocked": list(self.blocked),
            "unavailable": list(self.unavailable),
            "paused": self.paused,
            "notes": list(self.notes),
        }

    def render(self) -> list[str]:
        lines = [
            f"rollout to {self.target}: {sum(map(len, self.batches))} node(s) in {len(self.batches)} "
            f"batch(es) of at most {self.batch_size}; max unavailable {self.max_unavailable}; "
            f"failure budget {self.failure_budget}"
        ]
        for i, b in enumerate(self.batches, 1):
            lines.append(f"batch {i}: {', '.join(b)}")
        for what, names in (
            ("done", self.done),
            ("failed", self.failed),
            ("blocked by max_unavailable", self.blocked),
            ("unschedulable (counted against max_unavailable)", self.unavailable),
        ):
            if names:
                lines.append(f"{what}: {', '.join(names)}")
        lines.extend(self.notes)
        if self.paused:
            lines.append(
                f"paused: {len(self.failed)} failed node(s) reach the failure budget "
                f"{self.failure_budget} ({', '.join(self.failed)})"
            )
        return lines


def plan(
    nodes: Sequence[NodeView],
    target: str,
    *,
    batch: str | int = 1,
    max_unavailable: str | int = "25%",
    failure_budget: int = 1,
) -> Plan:
    """The batches of a rollout of `target` over `nodes` (inventory order)."""
    if failure_budget < 1:
        raise InputError(
            f"{failure_budget}: at least 1 (the rollout pauses once that many nodes failed)",
            flag="--failure-budget",
        )
    total = len(nodes)
    size = parse_size(batch, total, name="--batch")
    limit = parse_size(max_unavailable, total, name="--max-unavailable")
    done, failed, begun, cordoned, fresh = [], [], [], [], []
    for n in nodes:
        point = resume_point(n, target)
        if point == DONE:
            done.append(n.name)
        elif point == FAILED:
            failed.append(n.name)
        elif point != REQUIRED or n.cordoned_by_rollout:
            begun.append(n)
        elif n.unschedulable:
            cordoned.append(n)
        else:
            fresh.append(n)
    todo = [*begun, *cordoned, *fresh]
    todo_names = {n.name for n in todo}
    # unschedulable nodes the rollout is not working on (someone else's, failed ones left cordoned)
    others = tuple(n.name for n in nodes if n.unschedulable and n.name not in todo_names)
    room = limit - len(others)
    batches: list[tuple[str, ...]] = []
    blocked: list[str] = []
    notes: list[str] = []
    current: list[str] = []
    new_unavailable = 0
    for n in todo:
        costs = not n.unschedulable
        if costs and room < 1:
            blocked.append(n.name)
            continue
        if len(current) == size or (costs and new_unavailable + 1 > room):
            batches.append(tuple(current))
            current, new_unavailable = [], 0
        current.append(n.name)
        new_unavailable += costs
    if current:
        batches.append(tuple(current))
    if blocked:
        notes.append(
            f"max_unavailable {limit} is taken by {len(others)} unschedulable node(s): "
            f"{len(blocked)} node(s) wait"
        )
    return Plan(
        target=target,
        batches=tuple(batches),
        done=tuple(done),
        failed=tuple(failed),
        blocked=tuple(blocked),
        batch_size=size,
        max_unavailable=limit,
        unavailable=others,
        failure_budget=failure_budget,
        notes=tuple(notes),
    )


def budget_spent(failed: Sequence[str], budget: int) -> str | None:
    """The pause message once `failed` reach the failure budget, else None."""
    if len(failed) < budget:
        return None
    return (
        f"rollout paused: {len(failed)} failed node(s) reach the failure budget {budget}: "
        f"{', '.join(sorted(failed))}"
    )


@dataclass(frozen=True)
class Admission:
    """Which nodes of the batch about to start may start, re-planned from the cluster's state now."""

    admitted: tuple[str, ...]
    waiting: tuple[str, ...]  # max_unavailable has no room for them now (a later run takes them)
    settled: tuple[str, ...]  # done or failed meanwhile: nothing to do
    failed: tuple[str, ...]  # every node of the rollout failed for the target, this batch's or not
    unavailable: tuple[str, ...]  # unschedulable nodes outside this batch (counted)
    max_unavailable: int
    failure_budget: int

    @property
    def paused(self) -> bool:
        return len(self.failed) >= self.failure_budget

    def to_dict(self) -> dict[str, Any]:
        return {
            "admitted": list(self.admitted),
            "waiting": list(self.waiting),
            "settled": list(self.settled),
            "failed": list(self.failed),
            "unavailable": list(self.unavailable),
            "max_unavailable": self.max_unavailable,
            "failure_budget": self.failure_budget,
            "paused": self.paused,
        }

    def render(self) -> list[str]:
        lines = [f"admitted: {', '.join(self.admitted) or 'none'}"]
        if self.waiting:
            lines.append(
                f"waiting (max unavailable {self.max_unavailable}, {len(self.unavailable)} unschedulable "
                f"outside this batch: {', '.join(self.unavailable)}): {', '.join(self.waiting)}"
            )
        if self.settled:
            lines.append(f"done or failed meanwhile: {', '.join(self.settled)}")
        return lines


def admit(
    nodes: Sequence[NodeView],
    batch: Sequence[str],
    target: str,
    *,
    max_unavailable: str | int = "25%",
    failure_budget: int = 1,
) -> Admission:
    """Re-plan one batch before it starts, from `nodes` as the cluster shows them now (all the rollout's
    nodes): a node that became unschedulable meanwhile counts against `max_unavailable` like any other
    outside the batch, every node failed for `target` counts against the failure budget (all wait once
    it is spent), a node done or failed meanwhile is left alone, and the batch's nodes start in order
    while they fit."""
    by_name = {n.name: n for n in nodes}
    unknown = [b for b in batch if b not in by_name]
    if unknown:
        raise InputError(f"not among the rollout's nodes: {', '.join(unknown)}", flag="--batch-nodes")
    limit = parse_size(max_unavailable, len(nodes), name="--max-unavailable")
    failed = tuple(n.name for n in nodes if resume_point(n, target) == FAILED)
    members = set(batch)
    others = tuple(n.name for n in nodes if n.unschedulable and n.name not in members)
    room = limit - len(others)
    admitted: list[str] = []
    waiting: list[str] = []
    settled: list[str] = []
    for name in batch:
        n = by_name[name]
        if resume_point(n, target) in (DONE, FAILED):
            settled.append(name)
        elif len(failed) >= failure_budget:
            waiting.append(name)
        elif not n.unschedulable and room < 1:
            waiting.append(name)
        else:
            room -= 0 if n.unschedulable else 1
            admitted.append(name)
    return Admission(
        tuple(admitted), tuple(waiting), tuple(settled), failed, others, limit, failure_budget
    )
