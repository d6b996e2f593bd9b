"""Pure parts of the Debian archive access: version mapping, mirror discovery, control parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeprep.errors import InputError
from nodeprep.sources import debian


@pytest.mark.parametrize("deb,upstream", [
    ("535.309.01-0+deb12u1", "535.309.01"),
    ("525.147.05-15~deb12u1", "525.147.05"),
    ("535.216.03-3~deb12u1", "535.216.03"),
    ("1:470.256.02-1~deb12u1", "470.256.02"),
])
def test_debian_version_to_driver(deb: str, upstream: str) -> None:
    assert debian.debian_version_to_driver(deb) == upstream


def test_host_mirrors_deb822_and_one_line(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.test/debian\nSuites: bookworm\n\n"
        "Types: deb\nURIs: http://mirror.test/debian-security\nSuites: bookworm-security\n")
    assert debian.host_mirrors(tmp_path) == ("http://mirror.test/debian", "http://mirror.test/debian-security")
    (tmp_path / "sources.list.d" / "debian.sources").unlink()
    (tmp_path / "sources.list").write_text("deb [arch=amd64] http://other.test/debian bookworm main\n")
    assert debian.host_mirrors(tmp_path) == ("http://other.test/debian", None)


def test_parse_control_first_stanza_with_continuations() -> None:
    text = "Package: a\nVersion: 1\nDescription: x\n more\n\nPackage: b\n"
    assert debian.parse_control(text) == {"Package": "a", "Version": "1", "Description": "x\nmore"}


def test_unknown_os_lists_known_targets() -> None:
    with pytest.raises(InputError, match=r"--os: unknown OS 'debian-99' \(known: debian-12, debian-13"):
        debian.release("debian-99")


def test_backports_kernel_gets_the_backports_suites(tmp_path: Path) -> None:
    archive = debian.DebianArchive(tmp_path, os_name="debian-12", kernel="6.12.95+deb12-amd64",
                                   mirror="http://127.0.0.1:9/debian")
    assert archive.release.suites == ("bookworm", "bookworm-updates", "bookworm-backports")
    assert archive.dir == tmp_path / "apt" / "debian-12-backports-amd64"
    main = debian.DebianArchive(tmp_path, os_name="debian-12", kernel="6.1.0-56-amd64",
                                mirror="http://127.0.0.1:9/debian")
    assert main.release.suites == ("bookworm", "bookworm-updates") and main.dir.name == "debian-12-amd64"


def test_private_apt_config_never_points_at_host_state(tmp_path: Path) -> None:
    archive = debian.DebianArchive(tmp_path, mirror="http://127.0.0.1:9/debian")
    opts = archive._options()
    values = dict(o.split("=", 1) for o in opts[1::2])
    assert values["Dir::State::status"] == "/dev/null"
    for key in ("Dir::Etc::SourceList", "Dir::State::Lists", "Dir::Cache::archives"):
        assert values[key].startswith(str(tmp_path)), key
