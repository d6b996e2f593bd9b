"""The bootstrap step engine: per-step records keyed by the profile digest, resume after a failure,
nothing written on a rerun after success, a changed profile starts over. The steps here are small
real steps writing files under a temporary root (the engine's interface is the unit under test)."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

import pytest

from nodeprep import bootstrap as bs
from nodeprep.errors import StateError

PROFILE = """# a node
driver:
  version: "535.309.01"
  store: /srv/store
labels:
  cloud: none
"""


class Recorder:
    """Steps that write ROOT/out/<name> and remember which ran; `gate` makes `second` fail until
    the file exists (a transient failure such as a store not mounted yet)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ran: list[str] = []
        self.gate = root / "gate"

    def step(self, name: str) -> bs.Step:
        def run(ctx: bs.Context) -> dict[str, Any]:
            self.ran.append(name)
            if name == "second" and not self.gate.exists():
                raise StateError(f"{self.gate}: not there yet")
            seen = sorted(ctx.results)
            out = ctx.root / "out" / name
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(seen))
            return {"summary": f"wrote {name}", "saw": seen}

        return bs.Step(name, name.title(), run)

    def steps(self) -> list[bs.Step]:
        return [self.step(n) for n in ("first", "second", "third")]


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, Recorder]:
    root = tmp_path / "root"
    root.mkdir()
    profile = tmp_path / "node.yaml"
    profile.write_text(PROFILE)
    return root, profile, Recorder(root)


def snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            st = p.stat()
            out[str(p.relative_to(root))] = (st.st_mtime_ns, p.read_bytes())
    return out


def test_runs_all_steps_and_records_them(setup: tuple[Path, Path, Recorder]) -> None:
    root, profile, rec = setup
    rec.gate.touch()
    report = bs.bootstrap(profile, root=root, steps=rec.steps())
    assert report.ok and report.changed
    assert [(o.name, o.status) for o in report.outcomes] == [("first", "done"), ("second", "done"),
                                                             ("third", "done")]
    assert json.loads((root / "out/third").read_text()) == ["first", "second"]
    state = json.loads((root / "var/lib/nodeprep/bootstrap.json").read_text())
    run = state["runs"][report.digest]
    assert {n: s["status"] for n, s in run["steps"].items()} == {"first": "done", "second": "done",
                                                                 "third": "done"}
    assert run["steps"]["second"]["result"] == {"summary": "wrote second", "saw": ["first"]}
    data = report.to_json()
    assert data["ok"] is True and [s["status"] for s in data["steps"]] == ["done"] * 3


def test_rerun_after_success_changes_nothing(setup: tuple[Path, Path, Recorder]) -> None:
    root, profile, rec = setup
    rec.gate.touch()
    bs.bootstrap(profile, root=root, steps=rec.steps())
    before = snapshot(root)
    rec.ran.clear()
    report = bs.bootstrap(profile, root=root, steps=rec.steps())
    assert rec.ran == []
    assert report.ok and not report.changed
    assert [o.status for o in report.outcomes] == ["skipped"] * 3
    assert report.outcomes[1].result == {"summary": "wrote second", "saw": ["first"]}
    assert snapshot(root) == before


def test_failure_midway_resumes_at_the_failed_step(setup: tuple[Path, Path, Recorder]) -> None:
    root, profile, rec = setup
    report = bs.bootstrap(profile, root=root, steps=rec.steps())
    assert not report.ok
    assert [(o.name, o.status) for o in report.outcomes] == [("first", "done"), ("second", "failed"),
                                                             ("third", "pending")]
    assert report.outcomes[1].error == f"{rec.gate}: not there yet"
    state = json.loads((root / "var/lib/nodeprep/bootstrap.json").read_text())
    assert state["runs"][report.digest]["steps"]["second"]["status"] == "failed"
    assert "third" not in state["runs"][report.digest]["steps"]
    assert bs.summary_line(report).startswith("bootstrap: FAILED (rerun to resume) in ")
    first_written = (root / "out/first").stat().st_mtime_ns

    rec.ran.clear()
    rec.gate.touch()
    report = bs.bootstrap(profile, root=root, steps=rec.steps())
    assert rec.ran == ["second", "third"]
    assert [o.status for o in report.outcomes] == ["skipped", "done", "done"]
    assert (root / "out/first").stat().st_mtime_ns == first_written
    # results of the earlier run are visible to later steps
    assert json.loads((root / "out/third").read_text()) == ["first", "second"]


def test_profile_digest_keys_the_progress(setup: tuple[Path, Path, Recorder]) -> None:
    root, profile, rec = setup
    rec.gate.touch()
    first = bs.bootstrap(profile, root=root, steps=rec.steps())
    # comments and layout do not change the digest
    profile.write_text("# reformatted\n" + PROFILE.replace("  cloud: none", "  cloud:   none   # bare metal"))
    rec.ran.clear()
    same = bs.bootstrap(profile, root=root, steps=rec.steps())
    assert same.digest == first.digest and rec.ran == []
    # a changed value starts over
    profile.write_text(PROFILE.replace("535.309.01", "535.288.01"))
    changed = bs.bootstrap(profile, root=root, steps=rec.steps())
    assert changed.digest != first.digest and rec.ran == ["first", "second", "third"]
    state = json.loads((root / "var/lib/nodeprep/bootstrap.json").read_text())
    assert list(state["runs"]) == [changed.digest, first.digest]


def test_restart_runs_everything_again(setup: tuple[Path, Path, Recorder]) -> None:
    root, profile, rec = setup
    rec.gate.touch()
    bs.bootstrap(profile, root=root, steps=rec.steps())
    rec.ran.clear()
    report = bs.bootstrap(profile, root=root, steps=rec.steps(), restart=True)
    assert rec.ran == ["first", "second", "third"] and report.changed


def test_unreadable_state_is_a_clear_error(setup: tuple[Path, Path, Recorder]) -> None:
    root, profile, rec = setup
    state = root / "var/lib/nodeprep/bootstrap.json"
    state.parent.mkdir(parents=True)
    state.write_text("{not json")
    with pytest.raises(StateError, match=r"bootstrap.json: unreadable bootstrap state") as e:
        bs.bootstrap(profile, root=root, steps=rec.steps())
    assert e.value.hint and "--restart" in e.value.hint
    assert rec.ran == []
    rec.gate.touch()
    assert bs.bootstrap(profile, root=root, steps=rec.steps(), restart=True).ok


def test_a_second_bootstrap_at_the_same_time_is_refused(setup: tuple[Path, Path, Recorder]) -> None:
    root, profile, rec = setup
    lock = root / "var/lib/nodeprep/bootstrap.lock"
    lock.parent.mkdir(parents=True)
    fd = os.open(lock, os.O_CREAT | os.O_RDWR)
    try:
        # flock locks belong to the open file description: a second open() conflicts even in-process
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(StateError, match="another nodeprep bootstrap is running"):
            bs.bootstrap(profile, root=root, steps=rec.steps())
    finally:
        os.close(fd)
    assert rec.ran == []


def test_a_bug_in_a_step_is_recorded_and_raised(setup: tuple[Path, Path, Recorder]) -> None:
    root, profile, rec = setup

    def broken(ctx: bs.Context) -> dict[str, Any]:
        return {"not json": object()}

    with pytest.raises(TypeError):
        bs.bootstrap(profile, root=root, steps=[rec.step("first"), bs.Step("broken", "Broken", broken)])
    state = json.loads((root / "var/lib/nodeprep/bootstrap.json").read_text())
    (run,) = state["runs"].values()
    assert run["steps"]["first"]["status"] == "done"
    assert run["steps"]["broken"]["status"] == "failed"
    assert run["steps"]["broken"]["error"].startswith("TypeError: Object of type object")


def test_journal_lines() -> None:
    assert bs.describe(bs.Outcome("driver", "done", 1.25, {"summary": "535.309.01 active"})) == \
        "bootstrap: driver: done in 1.2s (535.309.01 active)"
    assert bs.describe(bs.Outcome("join", "failed", 0.5, error="kubeadm not found")) == \
        "bootstrap: join: failed in 0.5s: kubeadm not found"
    assert bs.describe(bs.Outcome("labels", "skipped")) == "bootstrap: labels: already done"
    assert bs.describe(bs.Outcome("join", "pending")) == "bootstrap: join: not run (an earlier step failed)"


def test_bad_profile_is_input_error(tmp_path: Path) -> None:
    bad = tmp_path / "node.yaml"
    bad.write_text("driver: {}\n")
    with pytest.raises(bs.InputError, match="driver.version"):
        bs.bootstrap(bad, root=tmp_path, steps=[])
    assert not (tmp_path / "var").exists()


def test_engine_runs_any_steps_with_its_own_record(tmp_path: Path) -> None:
    """The engine knows no profile or node: a caller's context, its own record file and name."""
    from nodeprep.bootstrap.engine import Journal, Step, load_record, run_steps

    journal = Journal(record=tmp_path / "demo.json", lock=tmp_path / "demo.lock", name="demo")
    seen: list[Any] = []

    def step(ctx: dict[str, Any]) -> dict[str, Any]:
        seen.append(ctx)
        return {"n": len(seen)}

    def context(results: Any) -> dict[str, Any]:
        return {"results": dict(results)}

    steps = [Step("a", "A", step), Step("b", "B", step)]
    report = run_steps(journal, "d1", steps, context, source="input")
    assert report.ok and report.record_path == tmp_path / "demo.json"
    assert seen == [{"results": {}}, {"results": {"a": {"n": 1}}}]
    record = load_record(journal)
    assert record["runs"]["d1"]["profile"] == "input"
    assert {n: s["status"] for n, s in record["runs"]["d1"]["steps"].items()} == {"a": "done", "b": "done"}
    again = run_steps(journal, "d1", steps, context, source="input")
    assert [o.status for o in again.outcomes] == ["skipped", "skipped"] and len(seen) == 2
    journal.record.write_text("{")
    with pytest.raises(StateError, match=r"demo.json: unreadable demo state"):
        run_steps(journal, "d1", steps, context, source="input")
