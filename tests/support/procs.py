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


def stop(proc: subprocess.Popen | None) -> None:  # type: ignore[type-arg]
    """SIGTERM to a server process of the test support, SIGKILL after 10 s; reaped either way."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
