"""Helpers for the fleet unit tests: the repository's roles, and the collection's modules importable."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
ROLES = REPO / "roles"
COLLECTIONS = REPO / "collections"
MODULES = COLLECTIONS / "ansible_collections/nodeprep/fleet/plugins/modules"


@pytest.fixture(scope="session")
def collection_on_path() -> Path:
    """Make `ansible_collections.nodeprep.fleet` importable (needs ansible-core for module_utils)."""
    pytest.importorskip("ansible")
    if str(COLLECTIONS) not in sys.path:
        sys.path.insert(0, str(COLLECTIONS))
    return MODULES
