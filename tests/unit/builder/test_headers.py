"""Kernel release -> headers packages, against package lists recorded from Debian 12's archive."""

from __future__ import annotations

import os

import pytest

from nodeprep.builder import headers
from nodeprep.errors import InputError


def test_default_release_is_the_metapackage_target(recorded_archive):
    hdrs = headers.resolve(recorded_archive, None)
    assert hdrs.release == "6.1.0-56-amd64"
    assert hdrs.packages == (
        ("linux-headers-6.1.0-56-amd64", "6.1.192-2"),
        ("linux-headers-6.1.0-56-common", "6.1.192-2"),
        ("linux-kbuild-6.1", "6.1.192-2"),
    )


def test_older_release_gets_its_own_common_and_matching_kbuild(recorded_archive):
    hdrs = headers.resolve(recorded_archive, "6.1.0-50-amd64")
    assert dict(hdrs.packages) == {
        "linux-headers-6.1.0-50-amd64": "6.1.176-1",
        "linux-headers-6.1.0-50-common": "6.1.176-1",
        "linux-kbuild-6.1": "6.1.176-1",
    }


def test_unknown_release_lists_available(recorded_archive):
    with pytest.raises(InputError) as e:
        headers.resolve(recorded_archive, "6.1.0-99-amd64")
    msg = str(e.value)
    assert msg.startswith("--kernel: no headers for kernel '6.1.0-99-amd64'")
    for rel in ("6.1.0-56-amd64", "6.1.0-50-amd64", "6.1.0-56-cloud-amd64"):
        assert rel in msg
    assert "linux-headers-amd64" not in msg and "common" not in msg


def test_available_releases_of_a_flavour(archive_data):
    rels = headers.available_releases(archive_data["linux_headers_packages"], "amd64")
    assert rels[:1] != [] and all(r.endswith("-amd64") and "cloud" not in r and "rt-" not in r for r in rels)
    assert "6.1.0-56-amd64" in rels and "6.1.0-50-amd64" in rels
    assert rels.index("6.1.0-56-amd64") < rels.index("6.1.0-50-amd64")


def test_parse_depends():
    deps = headers.parse_depends(
        "linux-headers-6.1.0-56-common (= 6.1.192-2), linux-kbuild-6.1 (>= 6.1.192-2), "
        "linux-compiler-gcc-12-x86 | gcc-12"
    )
    assert deps == [
        ("linux-headers-6.1.0-56-common", "=", "6.1.192-2"),
        ("linux-kbuild-6.1", ">=", "6.1.192-2"),
        ("linux-compiler-gcc-12-x86", None, None),
    ]


def test_install_into_merged_usr_root_never_writes_through_links(tmp_path):
    """A hard-link clone of the cached root must not be modified through its links, and a
    package's /lib must land in /usr/lib without replacing the root's lib -> usr/lib link."""
    cached, clone, stage = tmp_path / "cached", tmp_path / "clone", tmp_path / "stage"
    (cached / "usr" / "lib").mkdir(parents=True)
    (cached / "usr" / "src").mkdir(parents=True)
    (cached / "usr" / "src" / "shared.txt").write_text("cached")
    os.symlink("usr/lib", cached / "lib")
    (clone / "usr" / "lib").mkdir(parents=True)
    (clone / "usr" / "src").mkdir(parents=True)
    os.link(cached / "usr" / "src" / "shared.txt", clone / "usr" / "src" / "shared.txt")
    os.symlink("usr/lib", clone / "lib")
    (stage / "lib" / "modules" / "6.1.0-56-amd64").mkdir(parents=True)
    os.symlink(
        "/usr/src/linux-headers-6.1.0-56-amd64", stage / "lib" / "modules" / "6.1.0-56-amd64" / "build"
    )
    (stage / "usr" / "src").mkdir(parents=True)
    (stage / "usr" / "src" / "shared.txt").write_text("from the package")
    headers.install_into(stage, clone)
    assert (clone / "lib").is_symlink() and os.readlink(clone / "lib") == "usr/lib"
    assert (
        os.readlink(clone / "usr/lib/modules/6.1.0-56-amd64/build") == "/usr/src/linux-headers-6.1.0-56-amd64"
    )
    assert (clone / "usr/src/shared.txt").read_text() == "from the package"
    assert (cached / "usr/src/shared.txt").read_text() == "cached"
