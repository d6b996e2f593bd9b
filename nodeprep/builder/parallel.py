"""Building several cells at once: one worker process per running cell, stopped together.

`build_cells` runs `build_driver` for each request in a process pool (fork); a failing cell is a
result with its error, not an exception. Ctrl-C reaches every worker (same process group) and each
unwinds like build-driver does (compiler killed, workspace removed, nothing published); a SIGTERM
sent to the parent alone is passed on to the workers. Used by `nodeprep build-matrix --build`.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import NodeprepError
from .driver import build_driver

if TYPE_CHECKING:
    from .resolve import BuildRequest

_TERMINATED = False


def sigterm_as_interrupt() -> None:
    """SIGTERM unwinds like Ctrl-C, so temporary directories are removed on the way out (and
    `build_cells` remembers it was terminated, to pass the signal on to its workers)."""
    if threading.current_thread() is threading.main_thread():

        def handler(signum: int, frame: Any) -> None:
            global _TERMINATED
            _TERMINATED = True
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, handler)


def build_cells(work: Sequence[tuple[dict[str, Any], BuildRequest]], jobs: int) -> list[dict[str, Any]]:
    """Build every (cell description, request) of `work`, `jobs` at a time, in worker processes.

    One result per cell, in order: `{"cell": ..., "ok": True, **BuildResult.to_dict()}` or
    `{"cell": ..., "ok": False, "error": "..."}`. KeyboardInterrupt after every worker stopped when
    interrupted (Ctrl-C, or SIGTERM after `sigterm_as_interrupt`)."""
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("fork"))
    try:
        results = list(pool.map(_cell, work))
    except (KeyboardInterrupt, BrokenProcessPool):
        if _TERMINATED:  # SIGTERM went to us only: pass it on (workers unwind on SIGTERM too)
            for pid in list(getattr(pool, "_processes", {}) or {}):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        pool.shutdown(wait=True, cancel_futures=True)
        raise KeyboardInterrupt from None
    pool.shutdown(wait=True)
    return results


def published(results: Sequence[dict[str, Any]]) -> list[str]:
    """The artifact file names the successful cells of `results` published (kmod and user space)."""
    return [Path(n).name for r in results if r["ok"] for n in (r["name"], r.get("userspace")) if n]


def _cell(item: tuple[dict[str, Any], BuildRequest]) -> dict[str, Any]:
    """One cell, in a worker process."""
    cell, req = item
    try:
        return {"cell": cell, "ok": True, **build_driver(req).to_dict()}
    except NodeprepError as e:
        return {"cell": cell, "ok": False, "error": str(e)}
