"""Progress events of long library work (a build): typed, emitted to a callback, never printed here.

The library reports *phases* (start, finish with seconds) and *advances* inside a phase (objects
compiled of a total, bytes downloaded of a total). Front-ends render them (the CLI: a self-rewriting
line on a terminal, a line at least every 30 s otherwise, see nodeprep/commands/render.py). The
same events give the per-phase timings a build result carries (`Phases.seconds`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

# Phases of build-driver, in the order they run, with their human names.
PHASES: dict[str, str] = {
    "resolve": "index and downloads",
    "buildroot": "build root",
    "compile": "compile",
    "smoke_test": "smoke test",
    "pack": "packing",
    "userspace": "user space",
}


@dataclass(frozen=True)
class PhaseStarted:
    phase: str  # a key of PHASES (or another short identifier)
    text: str  # what is being done, for humans


@dataclass(frozen=True)
class PhaseFinished:
    phase: str
    seconds: float
    ok: bool = True


@dataclass(frozen=True)
class Advanced:
    """`done` of `total` (None: unknown) `unit`s of work in `phase` are finished."""

    phase: str
    done: int
    total: int | None
    unit: str  # "objects" | "bytes"


Event = PhaseStarted | PhaseFinished | Advanced
Sink = Callable[[Event], None]
Clock = Callable[[], float]


@dataclass
class Phases:
    """Emits phase events to `sink` and adds up the seconds of each phase (a phase may run in
    several pieces: the seconds are summed). Thread-safe."""

    sink: Sink | None = None
    clock: Clock = time.monotonic
    seconds: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def emit(self, event: Event) -> None:
        if self.sink is not None:
            self.sink(event)

    @contextlib.contextmanager
    def phase(self, name: str, text: str) -> Iterator[None]:
        start = self.clock()
        self.emit(PhaseStarted(name, text))
        ok = False
        try:
            yield
            ok = True
        finally:
            took = self.clock() - start
            with self._lock:
                self.seconds[name] = round(self.seconds.get(name, 0.0) + took, 2)
            self.emit(PhaseFinished(name, round(took, 2), ok))

    def advance(self, phase: str, done: int, total: int | None, unit: str) -> None:
        self.emit(Advanced(phase, done, total, unit))

    def reporter(self, phase: str, unit: str) -> Callable[[int, int | None], None]:
        """A `(done, total)` callback (download, kbuild counters) that emits Advanced events."""
        return lambda done, total: self.advance(phase, done, total, unit)
