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
