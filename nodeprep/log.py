"""Logging setup and timed steps. Human messages go to stderr; `--json` output goes to stdout."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator

log = logging.getLogger("nodeprep")


def setup_logging(verbosity: int = 0, quiet: bool = False) -> None:
    level = logging.WARNING if quiet else (logging.DEBUG if verbosity > 0 else logging.INFO)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger("nodeprep")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def interactive() -> bool:
    """True when stderr is a terminal (progress bars and counters are shown)."""
    return sys.stderr.isatty()


@contextlib.contextmanager
def step(text: str, *, logger: logging.Logger = log) -> Iterator[None]:
    """Log `text`, run the block, log how long it took (journal-friendly: one line each)."""
    logger.info("==> %s", text)
    start = time.monotonic()
    try:
        yield
    except BaseException:
        logger.info("<== %s failed after %.1fs", text, time.monotonic() - start)
        raise
    logger.info("<== %s (%.1fs)", text, time.monotonic() - start)


@contextlib.contextmanager
def timed(timings: dict[str, float], key: str, text: str | None = None) -> Iterator[None]:
    """Add how long the block took to `timings[key]` (and log it as a step when `text`)."""
    t = time.monotonic()
    with step(text) if text else contextlib.nullcontext():
        yield
    timings[key] = round(timings.get(key, 0.0) + time.monotonic() - t, 2)
