"""Batch planning and the failure budget (nodeprep.upgrade.policy): pure, over NodeViews."""

from __future__ import annotations

import pytest

from nodeprep.errors import InputError
from nodeprep.upgrade.policy import admit, budget_spent, parse_size, plan
from nodeprep.upgrade.states import NodeView


def nv(
    name: str,
    *,
    state: str | None = None,
    target: str | None = None,
    unschedulable: bool = False,
    ours: bool = False,
    driver: str | None = None,
) -> NodeView:
    return NodeView(name, state, target, driver, unschedulable, ours)


@pytest.mark.parametrize(
    ("value", "total", "want"),
    [
        ("3", 100, 3),
        (3, 100, 3),
        ("5%", 7500, 375),
        ("1%", 7500, 75),
        ("25%", 7500, 1875),
        ("1%", 10, 1),
        ("100%", 7, 7),
        (" 10 % ", 50, 5),
    ],
)
def test_parse_size(value: str | int, total: int, want: int) -> None:
    assert parse_size(value, total, name="--batch") == want


@pytest.mark.parametrize("bad", ["0", "0%", "101%", "five", "-1", "1.5"])
def test_parse_size_refuses(bad: str) -> None:
    with pytest.raises(InputError, match="--batch"):
        parse_size(bad, 10, name="--batch")


def test_batches_by_count_and_percentage() -> None:
    nodes = [nv(f"n{i}") for i in range(1, 11)]
    assert plan(nodes, "550.1", batch=3, max_unavailable="100%").batches == (
        ("n1", "n2", "n3"),
        ("n4", "n5", "n6"),
        ("n7", "n8", "n9"),
        ("n10",),
    )
    assert [len(b) for b in plan(nodes, "550.1", batch="20%", max_unavailable="100%").batches] == [2] * 5


def test_max_unavailable_caps_batches_and_counts_unschedulable_nodes() -> None:
    nodes = [nv(f"n{i}") for i in range(1, 9)] + [
        nv("cordoned-by-ops", unschedulable=True, state="upgrade-done", target="550.1")
    ]
    p = plan(nodes, "550.1", batch=4, max_unavailable=3)
    # one unschedulable node outside the rollout leaves room for 2 newly unschedulable per batch
    assert p.unavailable == ("cordoned-by-ops",)
    assert [len(b) for b in p.batches] == [2, 2, 2, 2]


def test_order_resumed_then_unschedulable_then_the_rest_and_done_failed_left_out() -> None:
    nodes = [
        nv("a"),
        nv("b", state="upgrade-done", target="550.1", driver="550.1"),
        nv("c", state="drain-required", target="550.1", unschedulable=True, ours=True),
        nv("d", unschedulable=True),
        nv("e", state="upgrade-failed", target="550.1", unschedulable=True),
        nv("f"),
    ]
    p = plan(nodes, "550.1", batch=2, max_unavailable="100%", failure_budget=3)
    assert p.batches == (("c", "d"), ("a", "f"))
    assert p.done == ("b",) and p.failed == ("e",)
    assert p.unavailable == ("e",)  # a failed node stays cordoned and keeps counting
    assert not p.paused


def test_all_room_taken_blocks_but_unschedulable_nodes_still_go() -> None:
    nodes = [
        nv("x", unschedulable=True),
        nv("y", unschedulable=True, state="upgrade-done", target="9"),
        nv("z"),
    ]
    p = plan(nodes, "9", batch=5, max_unavailable=1)
    assert p.batches == (("x",),) and p.blocked == ("z",)
    assert "wait" in p.notes[0]


def test_failure_budget() -> None:
    nodes = [nv("a", state="upgrade-failed", target="9"), nv("b")]
    assert plan(nodes, "9", failure_budget=1).paused
    assert not plan(nodes, "9", failure_budget=2).paused
    assert budget_spent(["b", "a"], 2) == "rollout paused: 2 failed node(s) reach the failure budget 2: a, b"
    assert budget_spent(["a"], 2) is None
    with pytest.raises(InputError, match="--failure-budget"):
        plan(nodes, "9", failure_budget=0)


def test_plan_renders_and_serialises() -> None:
    p = plan([nv("a"), nv("b"), nv("c")], "9", batch=2, max_unavailable="100%")
    assert p.render()[:3] == [
        "rollout to 9: 3 node(s) in 2 batch(es) of at most 2; max unavailable 3; failure budget 1",
        "batch 1: a, b",
        "batch 2: c",
    ]
    assert p.to_dict()["serial"] == [2, 1] and p.to_dict()["order"] == ["a", "b", "c"]


def test_a_fleet_of_7500_plans_in_1_percent_batches() -> None:
    nodes = [nv(f"gpu-{i:04d}") for i in range(7500)]
    p = plan(nodes, "9", batch="1%", max_unavailable="25%")
    assert len(p.batches) == 100 and {len(b) for b in p.batches} == {75}


def test_a_batch_is_replanned_from_the_cluster_before_it_starts() -> None:
    """Planned once: n1..n4 in batches of 2 under max_unavailable 2. Before the second batch (n3, n4)
    someone cordoned n5 and n1 failed (left cordoned): two unschedulable nodes outside the batch use the
    room up, so n3 and n4 wait; n2 done and uncordoned costs nothing."""
    t = "550.163.01"
    fresh = [nv(f"n{i}") for i in range(1, 6)]
    assert plan(fresh, t, batch=2, max_unavailable=2, failure_budget=2).batches == (
        ("n1", "n2"),
        ("n3", "n4"),
        ("n5",),
    )
    now = [
        nv("n1", state="upgrade-failed", target=t, unschedulable=True, ours=True),
        nv("n2", state="upgrade-done", target=t),
        nv("n3"),
        nv("n4"),
        nv("n5", unschedulable=True),  # cordoned by someone else meanwhile
    ]
    a = admit(now, ["n3", "n4"], t, max_unavailable=2, failure_budget=2)
    assert a.admitted == () and a.waiting == ("n3", "n4") and not a.paused
    assert a.unavailable == ("n1", "n5") and a.failed == ("n1",)
    assert "waiting (max unavailable 2, 2 unschedulable outside this batch: n1, n5): n3, n4" in a.render()
    # with room for one more: n3 starts, n4 waits; a batch node cordoned already costs nothing
    a = admit(now, ["n3", "n4"], t, max_unavailable=3, failure_budget=2)
    assert a.admitted == ("n3",) and a.waiting == ("n4",)
    now[3] = nv("n4", unschedulable=True, ours=True, state="pod-deletion-required", target=t)
    assert admit(now, ["n3", "n4"], t, max_unavailable=3, failure_budget=2).admitted == ("n3", "n4")


def test_failures_meanwhile_spend_the_budget_before_a_batch() -> None:
    t = "550.163.01"
    now = [
        nv("n1", state="upgrade-failed", target=t, unschedulable=True),
        nv("n2", state="upgrade-failed", target=t, unschedulable=True),
        nv("n3"),
        nv("n4", state="upgrade-done", target=t),
    ]
    a = admit(now, ["n3", "n4"], t, max_unavailable="100%", failure_budget=2)
    assert a.paused and a.admitted == () and a.waiting == ("n3",) and a.settled == ("n4",)
    assert not admit(now, ["n3"], t, max_unavailable="100%", failure_budget=3).paused
    with pytest.raises(InputError, match="not among the rollout's nodes: n9"):
        admit(now, ["n9"], t)
