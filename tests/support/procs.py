"""Stopping the process groups the test support starts (each with start_new_session=True)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def terminate_group(proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
    """SIGTERM to the process group of `proc`, unless it is already gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)


def wait_or_kill_group(proc: subprocess.Popen, grace: float) -> None:  # type: ignore[type-arg]
    """Waits `grace` seconds for `proc` to exit, then SIGKILLs its process group and reaps it."""
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
