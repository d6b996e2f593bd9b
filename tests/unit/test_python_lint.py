"""ruff (pyproject's [tool.ruff]: pycodestyle, pyflakes, isort, pyupgrade, bugbear) over the Python
tree. Skipped only where ruff is not installed; CI installs the pinned version (scripts/deps/lint.pip)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from nodeprep import runner

REPO = Path(__file__).resolve().parents[2]
TARGETS = ["nodeprep", "collections", "tests", "bench", "acceptance"]


def test_ruff_is_clean() -> None:
    local = Path(sys.executable).parent / "ruff"
    ruff = str(local) if local.exists() else shutil.which("ruff")
    if not ruff:
        pytest.skip("ruff is not installed (scripts/deps/lint.pip)")
    r = runner.run([ruff, "check", "--no-cache", "--output-format", "concise", *TARGETS],
                   check=False, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
