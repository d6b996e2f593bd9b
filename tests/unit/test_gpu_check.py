"""scripts/gpu-check.sh on a machine without an NVIDIA GPU or driver (this one, CI): one clear
`skipped` line, exit 3, nothing written (not in its temp directory's parent, not in the checkout, not
in HOME). On a machine with a GPU the lead runs it for real (docs/labels.md). The shell scripts pass
shellcheck (Debian's, scripts/deps/lint.apt)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.fixtures import REPO

SCRIPT = REPO / "scripts" / "gpu-check.sh"
SHELL_SCRIPTS = [REPO / ".ci" / "run", *sorted((REPO / "scripts").glob("*.sh"))]


def tree(path: Path) -> dict[str, int]:
    return {str(p.relative_to(path)): p.lstat().st_mtime_ns for p in path.rglob("*")
            if ".venv" not in p.parts and ".git" not in p.parts}


def test_skips_cleanly_without_a_gpu(tmp_path: Path) -> None:
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("this machine has an NVIDIA driver loaded: run scripts/gpu-check.sh itself")
    tmp, home = tmp_path / "tmp", tmp_path / "home"
    tmp.mkdir()
    home.mkdir()
    before = tree(REPO)
    env = {**os.environ, "TMPDIR": str(tmp), "HOME": str(home)}
    run = subprocess.run([str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 3, run.stdout + run.stderr
    assert run.stdout.startswith("gpu-check: skipped: no NVIDIA GPU/driver found (")
    assert len(run.stdout.splitlines()) == 1 and run.stderr == ""
    assert list(tmp.iterdir()) == [] and list(home.iterdir()) == []
    assert tree(REPO) == before
    bad = subprocess.run([str(SCRIPT), "--bogus"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("usage: scripts/gpu-check.sh")


def test_shell_scripts_pass_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck is not installed: run scripts/setup.sh (scripts/deps/lint.apt)")
    run = subprocess.run([shellcheck, *map(str, SHELL_SCRIPTS)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert SCRIPT in SHELL_SCRIPTS
