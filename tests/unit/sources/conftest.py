"""Fixtures for the tests of nodeprep/sources: the recorded Debian archive
(tests/support/recordedarchive.py)."""

from __future__ import annotations

from tests.support.recordedarchive import archive_data, recorded_archive

__all__ = ["archive_data", "recorded_archive"]
