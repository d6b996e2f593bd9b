"""`.ci/run` (CI's entry point: setup + the README's test command) passes its arguments to pytest."""

from __future__ import annotations

import os
import subprocess

from tests.support.fixtures import REPO


def test_ci_run_passes_its_arguments_through() -> None:
    env = {**os.environ, "NODEPREP_SETUP_NO_APT": "1"}
    run = subprocess.run([str(REPO / ".ci/run"), "--collect-only", "-q", "tests/unit/test_runner.py"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    collected = [line for line in run.stdout.splitlines() if "::" in line]
    assert collected and all(line.startswith("tests/unit/test_runner.py::") for line in collected)
