"""open-gpu-kernel-modules release tarballs (nodeprep.sources.opensource): the version is the top
directory's and version.mk's, and a tarball that is not a clean release tree is refused whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeprep.errors import ArtifactError, InputError
from nodeprep.sources import opensource
from tests.support.tarballs import Member, write_tgz


def release_members(top: str = "open-gpu-kernel-modules-580.142",
                    version_mk: str = "580.142") -> list[Member]:
    return [
        (f"{top}/", None, None),
        (f"{top}/Makefile", b"modules:\n\t$(MAKE) -C kernel-open modules\n", None),
        (f"{top}/version.mk", f"NVIDIA_VERSION = {version_mk}\nNVIDIA_NVID_VERSION = {version_mk}\n".encode(),
         None),
        (f"{top}/kernel-open/", None, None),
        (f"{top}/kernel-open/Kbuild", b"obj-m += nvidia.o\n", None),
        (f"{top}/kernel-open/conftest.sh", b"#!/bin/sh\n", None),
        (f"{top}/src/nvidia/Makefile", b"all:\n", None),
    ]


def test_version_and_tree_of_a_release(tmp_path: Path) -> None:
    tgz = write_tgz(tmp_path / "open-gpu-kernel-modules-580.142.tar.gz", release_members())
    assert opensource.read_version(tgz) == "580.142"
    tree = opensource.extract_tree(tgz, tmp_path / "out" / "kernel")
    assert (tree / "kernel-open" / "Kbuild").read_text() == "obj-m += nvidia.o\n"
    assert (tree / "src" / "nvidia" / "Makefile").is_file()
    assert (tree / "kernel-open" / "conftest.sh").stat().st_mode & 0o777 == 0o755
    assert (tree / "Makefile").stat().st_mode & 0o777 == 0o644


def test_names_carry_versions() -> None:
    assert opensource.name_version("open-gpu-kernel-modules-580.142.tar.gz") == "580.142"
    assert opensource.name_version("open-gpu-kernel-modules-595.45.04.tar.xz") == "595.45.04"
    assert opensource.name_version("580.142.tar.gz") is None
    url = "https://example.invalid/a/open-gpu-kernel-modules-580.142.tar.gz?x=1"
    assert opensource.release_name(url) == "open-gpu-kernel-modules-580.142.tar.gz"


@pytest.mark.parametrize("members, problem", [
    (release_members(version_mk="580.126.09"),
     "version.mk says NVIDIA_VERSION 580.126.09, the top directory says 580.142"),
    (release_members(top="nvidia-580.142"),
     "top directory 'nvidia-580.142' is not open-gpu-kernel-modules-<version>"),
    ([m for m in release_members() if not m[0].endswith("version.mk")], "no version.mk"),
])
def test_versions_that_do_not_add_up_are_refused(tmp_path: Path, members: list[Member], problem: str) -> None:
    tgz = write_tgz(tmp_path / "r.tar.gz", members)
    with pytest.raises(InputError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        opensource.read_version(tgz)


@pytest.mark.parametrize("extra, problem", [
    (("open-gpu-kernel-modules-580.142/../evil", b"x", None), "contains '..'"),
    (("/etc/evil", b"x", None), "absolute path"),
    (("other-top/Makefile", b"x", None), "outside the top directory"),
    (("open-gpu-kernel-modules-580.142/kernel-open/link", None, "/etc/passwd"), "not a file or directory"),
    (("open-gpu-kernel-modules-580.142/Makefile", b"again", None), "appears twice"),
])
def test_unsafe_members_are_refused_and_nothing_leaves_the_tree(tmp_path: Path, extra: Member,
                                                               problem: str) -> None:
    members = release_members()
    tgz = write_tgz(tmp_path / "r.tar.gz", members[:3] + [extra] + members[3:])
    with pytest.raises(ArtifactError, match=problem):
        opensource.extract_tree(tgz, tmp_path / "out" / "kernel")
    assert not (tmp_path / "evil").exists() and not (tmp_path / "out" / "evil").exists()


def test_foreign_files_are_refused(tmp_path: Path) -> None:
    junk = tmp_path / "open-gpu-kernel-modules-580.142.tar.gz"
    junk.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises((InputError, ArtifactError), match=junk.name):
        opensource.read_version(junk)
    bare = write_tgz(tmp_path / "bare.tar.gz", [m for m in release_members() if "kernel-open" not in m[0]])
    with pytest.raises(InputError, match="no Makefile and kernel-open/Kbuild"):
        opensource.extract_tree(bare, tmp_path / "out")
