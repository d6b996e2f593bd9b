"""Fixtures for the fleet tier: real SSH test hosts (tests/support/testhosts.py) and playbook runs."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import testhosts

pytestmark = pytest.mark.slow


def _require_tools() -> None:
    missing = [t for t in ("mmdebstrap", "ssh", "ssh-keygen", "ip") if shutil.which(t) is None]
    if missing:
        pytest.skip("fleet test hosts need " + ", ".join(missing) + " (scripts/deps/fleet.apt)")
    try:
        import ansible  # noqa: F401
    except ImportError:
        pytest.skip("ansible-core is not installed (pip install -e .[test])")


@pytest.fixture
def fleet3(test_cache: Path, tmp_path: Path) -> Iterator[testhosts.Fleet]:
    """Three fresh SSH test hosts (node1..node3), torn down after the test even when it fails."""
    _require_tools()
    with testhosts.fleet(test_cache, tmp_path, 3) as fl:
        yield fl
