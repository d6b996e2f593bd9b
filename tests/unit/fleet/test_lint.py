"""ansible-lint (production profile) and yamllint over roles, playbooks and inventories.
Skipped only where the linter is not installed; CI installs it (scripts/deps/fleet.pip)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from nodeprep import runner

from .conftest import REPO

TARGETS = ["roles", "playbooks", "inventories"]


def _tool(name: str) -> str:
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed (scripts/deps/fleet.pip)")
    return found


def test_ansible_lint_production_profile() -> None:
    lint = _tool("ansible-lint")
    r = runner.run(
        [lint, "--profile", "production", "--nocolor", *TARGETS],
        check=False,
        cwd=REPO,
        timeout=600,
        inherit_env=True,
        env={"ANSIBLE_CONFIG": str(REPO / "ansible.cfg")},
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "Profile 'production' was required, and it passed" in r.stdout + r.stderr


def test_yamllint_strict() -> None:
    lint = _tool("yamllint")
    r = runner.run([lint, "--strict", "-c", REPO / ".yamllint", *TARGETS], check=False, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:]
