"""The per-node upgrade state machine (nodeprep.upgrade.states): GPU Operator's names, resume points,
the patches, who cordoned. Pure functions over Node JSON; nothing GPU-like."""

from __future__ import annotations

from typing import Any

import pytest

from nodeprep.errors import InputError
from nodeprep.upgrade import states as st


def node(
    name: str = "n1",
    *,
    state: str | None = None,
    target: str | None = None,
    unschedulable: bool = False,
    cordoned: bool = False,
    driver: str | None = None,
) -> dict[str, Any]:
    labels = {st.STATE_LABEL: state} if state else {}
    if driver:
        labels[st.DRIVER_LABEL] = driver
    notes = {st.TARGET_ANNOTATION: target} if target else {}
    if cordoned:
        notes[st.CORDONED_ANNOTATION] = "true"
    return {
        "metadata": {"name": name, "labels": labels, "annotations": notes},
        "spec": {"unschedulable": True} if unschedulable else {},
    }


def test_the_gpu_operator_state_names_in_order() -> None:
    assert st.STATES == (
        "upgrade-required",
        "cordon-required",
        "wait-for-jobs-required",
        "pod-deletion-required",
        "drain-required",
        "pod-restart-required",
        "validation-required",
        "uncordon-required",
        "upgrade-done",
        "upgrade-failed",
    )
    assert st.STATE_LABEL == "nodeprep.dev/upgrade-state"


def test_next_state_walks_the_steps_to_done() -> None:
    walked = ["upgrade-required"]
    while walked[-1] != st.DONE:
        walked.append(st.next_state(walked[-1]))
    assert walked == [*st.STEPS, st.DONE]
    with pytest.raises(InputError):
        st.next_state(st.FAILED)


@pytest.mark.parametrize(
    ("state", "target", "want"),
    [
        (None, None, st.REQUIRED),
        ("drain-required", "550.1", "drain-required"),  # resumes where it stopped
        ("drain-required", "535.2", st.REQUIRED),  # a state of another rollout: starts over
        ("upgrade-done", "550.1", st.DONE),
        ("upgrade-failed", "550.1", st.FAILED),  # failed for this version stays failed
        ("upgrade-failed", "535.2", st.REQUIRED),
        ("bogus", "550.1", st.REQUIRED),
    ],
)
def test_resume_point(state: str | None, target: str | None, want: str) -> None:
    assert st.resume_point(st.view(node(state=state, target=target)), "550.1") == want


def test_remaining() -> None:
    assert st.remaining("validation-required") == ("validation-required", "uncordon-required")
    assert st.remaining(st.DONE) == ()
    with pytest.raises(InputError, match="not an upgrade state"):
        st.remaining("nope")


def test_state_patch_sets_reason_only_on_failure() -> None:
    failed = st.state_patch(st.FAILED, "550.1", reason="doctor: module not loaded")
    assert failed["metadata"]["labels"] == {st.STATE_LABEL: "upgrade-failed"}
    assert failed["metadata"]["annotations"] == {
        st.TARGET_ANNOTATION: "550.1",
        st.REASON_ANNOTATION: "doctor: module not loaded",
    }
    done = st.state_patch(st.DONE, "550.1")
    assert done["metadata"]["annotations"][st.REASON_ANNOTATION] is None  # merge patch: removed


def test_cordon_records_who_cordoned_and_uncordons_only_its_own() -> None:
    schedulable = st.view(node())
    assert st.cordon_patch(schedulable) == {
        "spec": {"unschedulable": True},
        "metadata": {"annotations": {st.CORDONED_ANNOTATION: "true"}},
    }
    theirs = st.view(node(unschedulable=True))
    assert st.cordon_patch(theirs) is None  # already cordoned by someone else: no record of ours
    assert st.uncordon_patch(theirs) is None  # so it stays cordoned
    ours = st.view(node(unschedulable=True, cordoned=True))
    assert st.uncordon_patch(ours) == {
        "spec": {"unschedulable": None},
        "metadata": {"annotations": {st.CORDONED_ANNOTATION: None}},
    }
    # someone uncordoned it meanwhile: only our record goes
    assert st.uncordon_patch(st.view(node(cordoned=True))) == {
        "metadata": {"annotations": {st.CORDONED_ANNOTATION: None}}
    }
