"""A generic resumable step engine: run named steps in order, record each outcome in a JSON record
file under a digest of the input, and on a rerun skip the steps recorded as done for that digest.

A step is a function `context -> dict` (its JSON-able result); the caller builds the context from
the results of the steps done so far (`make_context`). A result with `"provisional": true` (a dry
run of the step) is recorded but not final: the next run runs that step again. The first failure
stops the run; the steps after it are reported as pending. A new digest starts over; the record
keeps the newest KEEP_RUNS digests. One run at a time per record (an flock on `Journal.lock`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from ..atomicfile import atomic_write
from ..errors import InputError, NodeprepError, StateError

RECORD_FORMAT = 1
KEEP_RUNS = 5  # digests kept in the record (newest first by start time)

Status = Literal["done", "skipped", "failed", "pending"]


@dataclass(frozen=True)
class Journal:
    """Where a resumable run keeps its record and its lock, and what messages call it."""

    record: Path
    lock: Path
    name: str  # e.g. "bootstrap"


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    run: Callable[[Any], dict[str, Any]]


@dataclass(frozen=True)
class Outcome:
    name: str
    status: Status
    seconds: float = 0.0
    result: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    exit_code: int = 0  # of the error: 2 for bad input (profile, store path), else 1


@dataclass(frozen=True)
class Report:
    digest: str
    outcomes: tuple[Outcome, ...]
    seconds: float
    record_path: Path

    @property
    def ok(self) -> bool:
        return all(o.status in ("done", "skipped") for o in self.outcomes)

    @property
    def changed(self) -> bool:
        return any(o.status in ("done", "failed") for o in self.outcomes)

    @property
    def exit_code(self) -> int:
        return next((o.exit_code or 1 for o in self.outcomes if o.status == "failed"), 0)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "changed": self.changed,
            "profile_digest": self.digest,
            "seconds": round(self.seconds, 3),
            "state": str(self.record_path),
            "exit_code": self.exit_code,
            "steps": [{**asdict(o), "seconds": round(o.seconds, 3)} for o in self.outcomes],
        }


# ---------------------------------------------------------------------------------------------
# The record file


def _empty_record() -> dict[str, Any]:
    return {"format": RECORD_FORMAT, "runs": {}}


def load_record(journal: Journal) -> dict[str, Any]:
    """The record of earlier runs ({"format", "runs": {digest: run}}); StateError when unreadable."""
    path = journal.record
    if not path.exists():
        return _empty_record()
    try:
        data: dict[str, Any] = json.loads(path.read_text())  # not an object: AttributeError below
        if data.get("format") != RECORD_FORMAT or not isinstance(data.get("runs"), dict):
            raise ValueError(f"format {data.get('format')!r}")
    except (ValueError, AttributeError) as e:
        raise StateError(f"{path}: unreadable {journal.name} state ({e})",
                         hint=f"remove it (or run with --restart) to start the {journal.name} over") from None
    return data


def save_record(journal: Journal, record: Mapping[str, Any]) -> None:
    """Write the record atomically (temp file, fsync, rename, fsync of the directory)."""
    atomic_write(journal.record, json.dumps(record, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def _locked(journal: Journal) -> Iterator[None]:
    path = journal.lock
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StateError(f"{path}: another nodeprep {journal.name} is running") from None
        yield


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------------------------------
# Running


def run_steps(
    journal: Journal,
    digest: str,
    steps: Sequence[Step],
    make_context: Callable[[Mapping[str, Mapping[str, Any]]], Any],
    *,
    source: str,
    restart: bool = False,
    on_outcome: Callable[[Outcome], None] | None = None,
    record_run: bool = True,
) -> Report:
    """Run `steps` in order, skipping those recorded as done for `digest`; stop at the first failure.
    `make_context(results)` gives a step what it sees (results: the earlier steps' results by name);
    `source` names the input in the record (the profile's path). Without `record_run` (a check:
    steps that only plan) every step runs, and nothing is locked, read or written."""
    start = time.monotonic()
    names = [s.name for s in steps]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate step names: {names}")
    outcomes: list[Outcome] = []
    with _locked(journal) if record_run else contextlib.nullcontext():
        try:
            record = load_record(journal) if record_run else _empty_record()
        except StateError:
            if not restart:
                raise
            record = _empty_record()
        run = record["runs"].get(digest)
        if run is None or restart:
            run = {"profile": source, "started": _now(), "steps": {}}
        recorded: dict[str, dict[str, Any]] = run["steps"]
        results: dict[str, Mapping[str, Any]] = {
            n: r.get("result", {}) for n, r in recorded.items() if r.get("status") == "done"
        }
        failed = False
        for step in steps:
            if failed:
                outcome = Outcome(step.name, "pending")
            elif _final(recorded.get(step.name, {})):
                outcome = Outcome(step.name, "skipped", result=results[step.name])
            else:
                ctx = make_context(dict(results))
                t0 = time.monotonic()
                try:
                    result = step.run(ctx) or {}
                    json.dumps(result)  # results are recorded: they must be JSON
                except NodeprepError as e:  # bootstrap reads the profile: name the field, not a flag
                    error = e.field_message() if isinstance(e, InputError) else str(e)
                    outcome = Outcome(step.name, "failed", time.monotonic() - t0, error=error,
                                      exit_code=e.exit_code)
                except Exception as e:
                    outcome = Outcome(step.name, "failed", time.monotonic() - t0,
                                      error=f"{type(e).__name__}: {e}", exit_code=1)
                    _note(journal, record, digest, run, outcome, save=record_run)
                    if on_outcome:
                        on_outcome(outcome)
                    raise
                else:
                    outcome = Outcome(step.name, "done", time.monotonic() - t0, result=result)
                    results[step.name] = result
                _note(journal, record, digest, run, outcome, save=record_run)
                failed = outcome.status == "failed"
            outcomes.append(outcome)
            if on_outcome:
                on_outcome(outcome)
    return Report(digest=digest, outcomes=tuple(outcomes), seconds=time.monotonic() - start,
                  record_path=journal.record)


def _final(entry: Mapping[str, Any]) -> bool:
    """A recorded step that a rerun skips: done, and not a provisional (dry-run) result."""
    return entry.get("status") == "done" and not entry.get("result", {}).get("provisional")


def _note(journal: Journal, record: dict[str, Any], digest: str, run: dict[str, Any],
          outcome: Outcome, *, save: bool = True) -> None:
    """Record one step's outcome (the run of `digest` moves to the front; old runs drop off)."""
    entry: dict[str, Any] = {"status": outcome.status, "seconds": round(outcome.seconds, 3), "at": _now()}
    if outcome.status == "done":
        entry["result"] = dict(outcome.result)
    if outcome.error:
        entry["error"] = outcome.error
    run["steps"][outcome.name] = entry
    run["completed"] = False
    runs = {digest: run, **{k: v for k, v in record["runs"].items() if k != digest}}
    record["runs"] = dict(list(runs.items())[:KEEP_RUNS])
    if save:
        save_record(journal, record)
