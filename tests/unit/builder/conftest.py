"""Fixtures for the build-side fast tests.

`recorded_archive` stands in for nodeprep.sources.debian.DebianArchive at the archive boundary
only: it answers from data recorded from Debian 12's real archive (data/debian12-archive.json,
see its _comment) instead of running apt.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from nodeprep.errors import InputError

DATA = Path(__file__).parent / "data"


class RecordedArchive:
    def __init__(self, data: dict) -> None:
        self.data = data
        self.calls: list[str] = []

    def update(self, max_age_s: float = 3600) -> None:
        pass

    def packages(self, regex: str) -> list[str]:
        rx = re.compile(regex)
        names = list(self.data["kernel_source_versions"]) + self.data["linux_headers_packages"]
        return sorted({n for n in names if rx.search(n)})

    def versions(self, package: str) -> list[str]:
        self.calls.append(package)
        if package in self.data["kernel_source_versions"]:
            return list(self.data["kernel_source_versions"][package])
        return list(self.data["versions"].get(package, []))

    def info(self, package: str, version: str | None = None) -> dict[str, str]:
        if package not in self.data["depends"]:
            raise InputError(f"{package}: not served by the Debian archive")
        return {"Package": package, "Depends": self.data["depends"][package]}


@pytest.fixture
def archive_data() -> dict:
    return json.loads((DATA / "debian12-archive.json").read_text())


@pytest.fixture
def recorded_archive(archive_data: dict) -> RecordedArchive:
    return RecordedArchive(archive_data)
