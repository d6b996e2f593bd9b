"""The real Debian archive through the private apt configuration."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nodeprep.artifact import sha256_file
from nodeprep.errors import InputError
from nodeprep.sources.debian import DebianArchive

pytestmark = pytest.mark.slow


def test_real_archive_serves_nvidia_packages(test_cache: Path) -> None:
    archive = DebianArchive(test_cache)
    versions = archive.versions("nvidia-kernel-source")
    assert versions and all(v.startswith(("5", "4")) for v in versions)
    headers = archive.packages(r"^linux-headers-6\.1\.0-[0-9]+-amd64$")
    assert headers, "no Debian 12 kernel headers found"
    deb = archive.download("nvidia-smi", versions[0])
    assert deb.name == f"nvidia-smi_{versions[0].replace(':', '%3a')}_amd64.deb"
    assert archive.download("nvidia-smi", versions[0]) == deb  # cached, verified again
    assert len(sha256_file(deb)) == 64
    with pytest.raises(InputError, match="available: " + re.escape(versions[0])):
        archive.download("nvidia-smi", "1.0-1")
    assert not (Path("/etc/apt/sources.list.d") / "nodeprep.list").exists()


def test_download_many_fetches_together_and_reports_bytes(test_cache: Path, tmp_path: Path) -> None:
    """Several packages in one apt run into an empty .deb cache (the apt lists are the test
    cache's): progress goes up to the sum of the sizes apt printed, the files are the archive's
    (sha256 checked), and a second call finds them cached without fetching."""
    archive = DebianArchive(test_cache)
    archive.update()
    archive.debs = tmp_path / "debs"
    specs: list[tuple[str, str | None]] = [("nvidia-modprobe", None), ("nvidia-persistenced", None)]
    seen: list[tuple[int, int | None]] = []
    paths = archive.download_many(specs, lambda done, total: seen.append((done, total)))
    assert [p.name.split("_", 1)[0] for p in paths] == ["nvidia-modprobe", "nvidia-persistenced"]
    total = sum(p.stat().st_size for p in paths)
    assert seen and seen[-1] == (total, total) and {t for _, t in seen} == {total}
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    stamps = [p.stat().st_mtime_ns for p in paths]
    seen.clear()
    assert archive.download_many(specs, lambda done, total: seen.append((done, total))) == paths
    assert seen == [(total, total)] and [p.stat().st_mtime_ns for p in paths] == stamps
