"""The SONAME rule (nodeprep/sonames.py) as extraction and verification apply it to real
`.tar.zst` artifacts written member by member (tests/support/rawartifact.py) with ELF files
written byte by byte (tests/support/elfsynth.py): `verify` finds a problem exactly when `extract`
refuses, and both name the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeprep import artifact, sonames
from nodeprep.errors import ArtifactError
from tests.support import rawartifact as ra
from tests.support.elfsynth import DT_SONAME, DT_STRTAB, STRINGS_AT, synth


@pytest.mark.parametrize("name, why", [
    ("libcuda.so.1", None), ("libnvidia-pkcs11-openssl3.so.535.309.01", None),
    ("", "is not a file name"), (".", "is not a file name"), ("..", "is not a file name"),
    ("../x", "is not a plain file name"), ("a/b", "is not a plain file name"),
    ("lib\0x", "is not a plain file name"), ("lib x.so", "printable ASCII"),
    ("lib\nx.so", "printable ASCII"), ("libé.so", "printable ASCII"), ("l" * 256, "longer than 255"),
])
def test_unsafe(name: str, why: str | None) -> None:
    found = sonames.unsafe(name)
    assert found == why if why is None else why in (found or "")


AMBIGUOUS = synth(strings=b"\0libone.so.1\0libtwo.so.1\0",
                  dynamic=[(DT_STRTAB, 0x400000 + STRINGS_AT), (DT_SONAME, 1), (DT_SONAME, 13)])
CASES = {
    "plain": ([ra.file("lib64/libx.so.535", synth(b"libx.so.1"), 0o755)], None),
    "no soname": ([ra.file("lib64/libx.so.535", synth(None), 0o755)], None),
    "not really ELF": ([ra.file("lib64/libx.so.535", b"\x7fELF-not-really", 0o755)], None),
    "escaping": ([ra.file("lib64/libx.so.535", synth(b"../../../../tmp/x/victim-link"), 0o755)],
                 "lib64/libx.so.535: SONAME '../../../../tmp/x/victim-link' is not a plain file name"),
    "escaping through a link": ([ra.file("bin/evil", synth(b"../../victim"), 0o755),
                                 ra.link("lib64/libz.so.1", "../bin/evil")],
                                "bin/evil: SONAME '../../victim' is not a plain file name"),
    "ambiguous": ([ra.file("lib64/liba.so.1.0", AMBIGUOUS, 0o755)],
                  "lib64/liba.so.1.0: ambiguous SONAME: 'libone.so.1', 'libtwo.so.1'"),
    "big-endian, read as a little-endian loader reads it": (
        [ra.file("lib64/libb.so.1.0", synth(b"libb.so.1", order=">"), 0o755)], "lib64/libb.so.1.0: "),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_extract_and_verify_agree(tmp_path: Path, case: str) -> None:
    members, problem = CASES[case]
    manifest = ra.manifest_for(members, kind="userspace")
    path = ra.write(tmp_path / "a.tar.zst", members, manifest)
    found = artifact.verify(path)
    dest = tmp_path / "dest"
    dest.mkdir()
    if problem is None:
        assert found == []
        artifact.extract(path, dest)
        return
    assert len(found) == 1 and found[0].startswith(problem), found
    with pytest.raises(ArtifactError) as e:
        artifact.extract(path, dest)
    assert str(e.value).startswith(f"{path}: {problem}")


@pytest.mark.parametrize("size", [1, 3, 5, 4096])
def test_spool_reads_whatever_the_chunking(size: int) -> None:
    data = synth(b"../escape") + bytes(5000)
    spool = sonames.Spool("lib64/libq.so.1")
    for i in range(0, len(data), size):
        spool.write(data[i:i + size])
    assert spool.problem() == "lib64/libq.so.1: SONAME '../escape' is not a plain file name"
    other = sonames.Spool("share/x.json")
    other.write(b"{}")
    assert other.problem() is None


def test_a_name_near_path_max_is_read_beneath_dest(tmp_path: Path) -> None:
    """The rule opens what it reads beneath dest's fd: dest's path plus an accepted name may be
    longer than PATH_MAX (found by tests/unit/test_extraction_property.py)."""
    name = "/".join(c * 200 for c in "abcdefghijklmnopqrst") + "/libx.so.1"
    for data, problem in ((synth(b"libx.so.1"), None), (synth(b"../x"), "SONAME '../x'")):
        members = [ra.file(name, data, 0o755)]
        path = ra.write(tmp_path / "a.tar.zst", members, ra.manifest_for(members, kind="userspace"))
        dest = tmp_path / ("dest-" + str(problem is None))
        dest.mkdir()
        if problem is None:
            assert artifact.verify(path) == []
            artifact.extract(path, dest)
            continue
        assert problem in artifact.verify(path)[0]
        with pytest.raises(ArtifactError, match=problem):
            artifact.extract(path, dest)
