from __future__ import annotations

import pytest

from tests.support.loopback import guard


@pytest.fixture
def attempts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The hosts the test tried to reach (tests/support/loopback.py); off-loopback ones refused."""
    return guard(monkeypatch)
