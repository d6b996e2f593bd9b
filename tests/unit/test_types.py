"""mypy (pyproject's [tool.mypy]: --strict over nodeprep/) passes, every `type: ignore` in it needed.
Skipped only where mypy is not installed; CI installs the pinned version and the stubs
(scripts/deps/lint.pip)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from nodeprep import runner

REPO = Path(__file__).resolve().parents[2]


def test_mypy_is_clean() -> None:
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (scripts/deps/lint.pip)")
    # the files and flags come from pyproject.toml; no cache, so nothing is written into the checkout
    r = runner.run([sys.executable, "-m", "mypy", "--cache-dir", "/dev/null"],
                   check=False, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stdout[-8000:] + r.stderr[-2000:]
