"""Rendering the library's progress events (nodeprep/progress.py) on stderr.

- a terminal: one self-rewriting line (`compiling 118/192 objects`, `downloading 12.3/69.0 MiB`);
- anything else (CI logs, Ansible, cloud-init's log): plain lines, one at least every `interval`
  seconds while work runs: the latest count of the running phase, or a heartbeat with the elapsed
  time for phases without a measurable total (creating the build root).
`LineRenderer.tick` is driven by a `Ticker` thread; the clock is injectable for tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TextIO

from ..progress import PHASES, Advanced, Clock, Event, PhaseFinished, PhaseStarted

INTERVAL_S = 30.0


def duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 60}m{s % 60:02d}s"


def describe(ev: Advanced) -> str:
    """`compiling 118/192 objects (61%)`, `downloading 12.3/69.0 MiB (17%)`."""
    if ev.unit == "bytes":
        text = f"downloading {ev.done / 2**20:.1f}" + (f"/{ev.total / 2**20:.1f} MiB" if ev.total else " MiB")
    else:
        verb = "compiling" if ev.phase == "compile" else PHASES.get(ev.phase, ev.phase)
        text = f"{verb} {ev.done}/{ev.total} {ev.unit}" if ev.total else f"{verb} {ev.done} {ev.unit}"
    if ev.total:
        text += f" ({100 * ev.done // ev.total}%)"
    return text


@dataclass
class _Running:
    text: str
    started: float
    last: Advanced | None = None


@dataclass
class LineRenderer:
    """Plain lines for logs: a line when `interval` seconds passed since the last one, on an event
    or on `tick()`. Lines: `  [2m30s] compile: compiling 118/192 objects (61%)` or
    `  [0m30s] build root: still working (0m30s in this phase)`."""

    out: TextIO
    clock: Clock = time.monotonic
    interval: float = INTERVAL_S
    started: float = field(init=False)
    last_line: float = field(init=False)
    running: dict[str, _Running] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.started = self.last_line = self.clock()

    def __call__(self, ev: Event) -> None:
        now = self.clock()
        with self.lock:
            if isinstance(ev, PhaseStarted):
                self.running[ev.phase] = _Running(ev.text, now)
            elif isinstance(ev, PhaseFinished):
                self.running.pop(ev.phase, None)
                if now - self.last_line >= self.interval:
                    what = PHASES.get(ev.phase, ev.phase)
                    state = "finished" if ev.ok else "failed"
                    self._write(now, f"{what}: {state} after {duration(ev.seconds)}")
                return
            elif isinstance(ev, Advanced):
                self.running.setdefault(ev.phase, _Running(PHASES.get(ev.phase, ev.phase), now)).last = ev
            self._maybe_print(now)

    def tick(self) -> None:
        now = self.clock()
        with self.lock:
            self._maybe_print(now)

    def _maybe_print(self, now: float) -> None:
        if now - self.last_line < self.interval:
            return
        if not self.running:
            self._write(now, "still working")
        for name, run in self.running.items():
            what = PHASES.get(name, name)
            if run.last is not None:
                self._write(now, f"{what}: {describe(run.last)}")
            else:
                self._write(now, f"{what}: still working ({duration(now - run.started)} in this phase)")

    def _write(self, now: float, text: str) -> None:
        self.out.write(f"  [{duration(now - self.started)}] {text}\n")
        self.out.flush()
        self.last_line = now


@dataclass
class TerminalRenderer:
    """One self-rewriting status line (stderr on a terminal)."""

    out: TextIO
    last: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __call__(self, ev: Event) -> None:
        with self.lock:
            if isinstance(ev, Advanced):
                text = "  " + describe(ev)
                if text != self.last:
                    self.out.write("\r" + text.ljust(len(self.last)))
                    self.out.flush()
                    self.last = text
            elif isinstance(ev, PhaseFinished):
                self.end()

    def tick(self) -> None:
        return None

    def end(self) -> None:
        if self.last:
            self.out.write("\n")
            self.out.flush()
            self.last = ""


@contextmanager
def ticker(tick: Callable[[], None], every: float = 5.0) -> Iterator[None]:
    """Call `tick` every `every` seconds in a daemon thread while the block runs."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every):
            tick()

    thread = threading.Thread(target=loop, name="progress-ticker", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
