"""A stand-in for nodeprep.sources.debian.DebianArchive at the archive boundary only: it answers
from apt's answers recorded from Debian's real archives (tests/fixtures/debian-archive, each file
says in its _comment what and when) instead of running apt. Folders whose tests resolve packages
take the fixtures into their conftest.py."""

from __future__ import annotations

import json
import re

import pytest

from nodeprep.errors import InputError
from tests.support.fixtures import DEBIAN_ARCHIVE


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


def recorded(name: str) -> RecordedArchive:
    """The stand-in answering from tests/fixtures/debian-archive/`name`."""
    return RecordedArchive(json.loads((DEBIAN_ARCHIVE / name).read_text()))


@pytest.fixture
def archive_data() -> dict:
    """Debian 12's recorded answers."""
    return json.loads((DEBIAN_ARCHIVE / "debian12-archive.json").read_text())


@pytest.fixture
def recorded_archive(archive_data: dict) -> RecordedArchive:
    return RecordedArchive(archive_data)
