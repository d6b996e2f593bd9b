"""Artifact format: determinism, verification, safe extraction, the store index."""

from __future__ import annotations

import io
import os
import re
import tarfile
from pathlib import Path

import pytest
import zstandard

from nodeprep import artifact, safetar
from nodeprep.errors import ArtifactError, ChecksumError, StateError
from tests.support import rawartifact as ra


def _manifest(**kw: object) -> artifact.Manifest:
    base = dict(kind="userspace", driver_version="535.309.01", arch="amd64", os="debian-12",
                input_digest="d" * 64, inputs={"libcuda1.deb": "a" * 64})
    base.update(kw)
    return artifact.Manifest(**base)  # type: ignore[arg-type]


def _payload(tmp: Path) -> Path:
    p = tmp / "payload"
    (p / "lib64").mkdir(parents=True)
    (p / "bin").mkdir()
    # ELF class 0: no header ldconfig (or nodeprep.sonames) would read a SONAME from
    (p / "lib64" / "libcuda.so.535.309.01").write_bytes(b"\x7fELF\0" + os.urandom(4095))
    (p / "lib64" / "libcuda.so.1").symlink_to("libcuda.so.535.309.01")
    (p / "bin" / "nvidia-smi").write_bytes(b"#!/bin/true\n")
    (p / "bin" / "nvidia-smi").chmod(0o700)
    return p


def test_pack_is_byte_identical_and_normalised(tmp_path: Path) -> None:
    payload = _payload(tmp_path)
    a, m = artifact.pack(payload, _manifest(), tmp_path / "a")
    os.utime(payload / "bin" / "nvidia-smi", (1, 1))  # mtimes must not matter
    b, _ = artifact.pack(payload, _manifest(), tmp_path / "b")
    assert a.name == "nvidia-userspace-535.309.01-amd64.tar.zst"
    assert a.read_bytes() == b.read_bytes()
    assert m.files["bin/nvidia-smi"].mode == 0o755
    assert m.files["lib64/libcuda.so.1"].target == "libcuda.so.535.309.01"
    assert m.files["lib64/libcuda.so.535.309.01"].sha256 == artifact.sha256_file(
        payload / "lib64" / "libcuda.so.535.309.01")
    with (zstandard.ZstdDecompressor().stream_reader(open(a, "rb")) as zr,
          tarfile.open(fileobj=zr, mode="r|") as t):
        members = [(ti.name, ti.uid, ti.gid, ti.mtime, ti.uname) for ti in t]
    assert members[0][0] == "manifest.json"
    assert all(uid == 0 and gid == 0 and mtime == 0 and uname == "" for _, uid, gid, mtime, uname in members)
    assert artifact.read_manifest(a) == m


def test_verify_catches_a_flipped_byte(tmp_path: Path) -> None:
    path, _ = artifact.pack(_payload(tmp_path), _manifest(), tmp_path / "store")
    assert artifact.verify(path) == []
    # Flip one byte inside the library's content: decompress, flip, recompress.
    raw = zstandard.ZstdDecompressor().decompressobj().decompress(path.read_bytes())
    pos = raw.index(b"\x7fELF") + 100
    bad = raw[:pos] + bytes([raw[pos] ^ 0xFF]) + raw[pos + 1:]
    path.write_bytes(zstandard.ZstdCompressor().compress(bad))
    problems = artifact.verify(path)
    assert len(problems) == 1 and problems[0].startswith("lib64/libcuda.so.535.309.01: sha256")
    with pytest.raises(ChecksumError):
        artifact.extract(path, _fresh(tmp_path / "x"))


def test_verify_reports_garbage(tmp_path: Path) -> None:
    bad = tmp_path / "junk.tar.zst"
    bad.write_bytes(b"not zstd at all")
    assert "not a valid .tar.zst" in artifact.verify(bad)[0]


def _fresh(p: Path) -> Path:
    p.mkdir(parents=True)
    return p


def _hostile(tmp: Path, member: tarfile.TarInfo, data: bytes = b"x") -> Path:
    m = _manifest(files={member.name: artifact.FileEntry(sha256=artifact.sha256_bytes(data), size=len(data),
                                                          mode=0o644)})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        mj = m.to_json()
        ti = tarfile.TarInfo("manifest.json")
        ti.size = len(mj)
        tar.addfile(ti, io.BytesIO(mj))
        if member.isreg():
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
        else:
            tar.addfile(member)
    out = tmp / "hostile.tar.zst"
    out.write_bytes(zstandard.ZstdCompressor().compress(buf.getvalue()))
    return out


def _ti(name: str, **kw: object) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    for k, v in kw.items():
        setattr(ti, k, v)
    return ti


@pytest.mark.parametrize("member,reason", [
    pytest.param(_ti("/etc/passwd"), "absolute", id="absolute"),
    pytest.param(_ti("lib64/../../etc/passwd"), "'..'", id="dotdot"),
    pytest.param(_ti("lib64/evil", type=tarfile.SYMTYPE, linkname="/etc/shadow"), "outside", id="abs-link"),
    pytest.param(_ti("lib64/evil", type=tarfile.SYMTYPE, linkname="../../../etc"), "outside", id="rel-link"),
    pytest.param(_ti("lib64/hard", type=tarfile.LNKTYPE, linkname="etc/passwd"), "hard link", id="hardlink"),
    pytest.param(_ti("dev/sda", type=tarfile.BLKTYPE, devmajor=8), "device", id="blockdev"),
    pytest.param(_ti("dev/mem", type=tarfile.CHRTYPE, devmajor=1, devminor=1), "device", id="chardev"),
    pytest.param(_ti("bin/suid", mode=0o4755), "setuid", id="setuid"),
    pytest.param(_ti("bin/sgid", mode=0o2755), "setuid", id="setgid"),
])
def test_extract_refuses_hostile_members(tmp_path: Path, member: tarfile.TarInfo, reason: str) -> None:
    path = _hostile(tmp_path, member)
    dest = _fresh(tmp_path / "dest")
    before = set(tmp_path.parent.iterdir())
    with pytest.raises(ArtifactError, match=reason):
        artifact.extract(path, dest)
    assert [p.name for p in dest.iterdir()] in ([], ["manifest.json"])
    assert set(tmp_path.parent.iterdir()) == before
    assert any(reason.strip("'") in p for p in artifact.verify(path))


def test_store_publish_and_index(tmp_path: Path) -> None:
    path, m = artifact.pack(_payload(tmp_path), _manifest(), tmp_path / "out")
    store = artifact.LocalStore(tmp_path / "store")
    entry = store.publish(path, m)
    assert (tmp_path / "store" / m.name).read_bytes() == path.read_bytes()
    entries = store.entries()
    assert entries == [entry] and entry.sha256 == artifact.sha256_file(path)
    assert artifact.find(entries, "userspace", "535.309.01") == entry
    assert artifact.find(entries, "kmod", "535.309.01") is None
    store.publish(path, m)  # republish replaces, never duplicates
    assert len(store.entries()) == 1


def test_input_digest_depends_on_every_input() -> None:
    base = artifact.input_digest({"a": "1", "b": "2"}, {"flavour": "open"})
    assert base == artifact.input_digest({"b": "2", "a": "1"}, {"flavour": "open"})
    assert base != artifact.input_digest({"a": "1", "b": "3"}, {"flavour": "open"})
    assert base != artifact.input_digest({"a": "1", "b": "2"}, {"flavour": "proprietary"})


def test_corrupt_compressed_data_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    path, _ = artifact.pack(_payload(tmp_path), _manifest(), tmp_path / "store")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the zstd frame: the decoder fails mid-member
    path.write_bytes(bytes(data))
    problems = artifact.verify(path)
    assert problems and any("corrupt" in p or "sha256" in p or "not a valid" in p for p in problems)
    with pytest.raises(ArtifactError):
        artifact.extract(path, _fresh(tmp_path / "x"))


def test_pack_bytes_do_not_depend_on_the_number_of_zstd_threads(tmp_path: Path) -> None:
    """Multi-threaded zstd cuts the input into jobs; the payload here spans several jobs (level 10:
    jobs of a few MiB), and 1, 2 and 4 workers must still give the same tarball."""
    payload = _payload(tmp_path)
    block = os.urandom(1 << 16)
    with open(payload / "lib64" / "libnvidia-big.so.535.309.01", "wb") as f:
        for i in range(640):  # 40 MiB, compressible (repeated blocks) so this stays fast
            f.write(block[i % 7:] + block[: i % 7])
    outs = [artifact.pack(payload, _manifest(), tmp_path / f"t{n}", threads=n)[0].read_bytes()
            for n in (1, 2, 4)]
    assert outs[0] == outs[1] == outs[2]
    raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(outs[0])).read()
    single = io.BytesIO()
    with zstandard.ZstdCompressor(level=artifact.ZSTD_LEVEL, write_checksum=True).stream_writer(
        single, closefd=False
    ) as w:
        w.write(raw)
    assert single.getvalue() != outs[0]  # the mode is fixed: single-threaded bytes would differ


# ---------------------------------------------------------------------------------------------
# Extraction rules (nodeprep/safetar.py): hand-written cases; generated ones are in
# test_extraction_property.py.


def _tree(top: Path) -> dict[str, str]:
    """Everything under `top` (links not followed): path -> 'dir' | 'link:<target>' | sha256."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for n in dirnames + filenames:
            p = Path(dirpath, n)
            kind = "link:" + os.readlink(p) if p.is_symlink() else "dir" if p.is_dir() else ""
            out[str(p.relative_to(top))] = kind or artifact.sha256_file(p)
    return out


def test_the_issue_archive_is_refused_by_extract_and_verify(tmp_path: Path) -> None:
    """Issue 18's archive: `p -> .`, `p/p/…(20)…/w -> ../…(20 + depth of dest)…/TARGET` (TARGET an
    absolute path outside), then a regular file `w`; everything listed in the manifest with matching
    hashes. Before the fix it was extracted with TARGET holding the attacker's bytes."""
    dest = _fresh(tmp_path / "sandbox" / "dest")
    target = tmp_path / "sandbox" / "TARGET"
    deep = "/".join(["p"] * 20 + ["w"])
    climb = "../" * (20 + len(dest.parts) - 1) + str(target).lstrip("/")
    members = [ra.link("p", "."), ra.link(deep, climb), ra.file("w", b"attacker's bytes\n")]
    path = ra.write(tmp_path / "hostile.tar.zst", members)
    before = _tree(tmp_path / "sandbox")
    with pytest.raises(ArtifactError, match=r"unsafe member 'p': link target '\.'") as e:
        artifact.extract(path, dest)
    assert e.value.exit_code == 2
    assert not target.exists() and _tree(tmp_path / "sandbox") == before
    assert any("unsafe member 'p'" in p for p in artifact.verify(path))


@pytest.mark.parametrize(("members", "reason"), [
    pytest.param([ra.link("p", "sub"), ra.file("sub/x"), ra.file("p/x")],
                 "goes through the earlier link member 'p'", id="through-link"),
    pytest.param([ra.link("p", "lib/x.so"), ra.file("lib/x.so"), ra.link("q", "p"), ra.file("q/y")],
                 "goes through the earlier link member 'q'", id="through-link-to-link"),
    pytest.param([ra.file("a"), ra.file("a/b")], "goes through the earlier file member 'a'",
                 id="through-file"),
    pytest.param([ra.file("a", b"1"), ra.file("a", b"1")], "duplicate name", id="duplicate"),
    pytest.param([ra.file("lib/x"), ra.link("lib", "y"), ra.file("y/z")], "would replace a directory",
                 id="link-replacing-dir"),
    pytest.param([ra.link("lib", "y"), ra.file("y/z"), ra.directory("lib"), ra.file("lib/q")],
                 "would replace the earlier link", id="dir-replacing-link"),
    pytest.param([ra.file("lib/a"), ra.file("Lib/b")], "case variant", id="case-variant-dir"),
    pytest.param([ra.file("x"), ra.file("X")], "case variant", id="case-variant-file"),
    pytest.param([ra.file("Manifest.json")], "case variant", id="case-variant-manifest"),
    pytest.param([ra.file("/".join(["d" * 200] * 21))], "longer than 4095 bytes", id="long-path"),
    pytest.param([ra.file("x" * 256)], "longer than 255 bytes", id="long-component"),
    pytest.param([ra.file("a/./b")], "not a canonical path", id="dot-component"),
    pytest.param([ra.link("a/l", "../../x")], "points outside the artifact", id="climb"),
    pytest.param([ra.link("a/l", "..")], "points outside the artifact or at a directory above", id="parent"),
    pytest.param([ra.link("a/l", "b/../../x")], "not '../'* followed by plain", id="dotdot-inside"),
    pytest.param([ra.link("l", "")], "empty link target", id="empty-target"),
])
def test_unsafe_member_sequences(tmp_path: Path, members: list[ra.M], reason: str) -> None:
    path = ra.write(tmp_path / "a.tar.zst", members)
    dest = _fresh(tmp_path / "sandbox" / "dest")
    (tmp_path / "sandbox" / "y").mkdir()
    before = _tree(tmp_path / "sandbox")
    with pytest.raises(ArtifactError, match=re.escape(reason)) as e:
        artifact.extract(path, dest)
    assert e.value.exit_code == 2
    after = _tree(tmp_path / "sandbox")
    assert {k: v for k, v in after.items() if not k.startswith("dest/")} == before
    assert any(reason in p for p in artifact.verify(path)), artifact.verify(path)


def test_links_to_links_inside_are_accepted(tmp_path: Path) -> None:
    members = [ra.file("lib64/libcuda.so.535.309.01", b"\x7fELF"),
               ra.link("lib64/libcuda.so.1", "libcuda.so.535.309.01"),
               ra.link("lib64/libcuda.so", "libcuda.so.1"), ra.link("bin/lib", "../lib64/libcuda.so")]
    path = ra.write(tmp_path / "a.tar.zst", members)
    dest = _fresh(tmp_path / "dest")
    assert artifact.verify(path) == []
    artifact.extract(path, dest)
    assert (dest / "bin/lib").resolve() == (dest / "lib64/libcuda.so.535.309.01").resolve()


def test_the_writer_never_follows_a_link(tmp_path: Path) -> None:
    """safetar.Beneath on its own (no rules in front of it): a link already in place is never
    written through or replaced, whatever the caller asks."""
    outside = _fresh(tmp_path / "outside")
    dest = _fresh(tmp_path / "dest")
    with safetar.Beneath(dest) as out:
        out.make_link("p", str(outside))
        out.make_link("q", "p")
        for attempt in (lambda: out.write_file("p/x", [b"no"], 0o644),
                        lambda: out.write_file("q/x", [b"no"], 0o644),
                        lambda: out.write_file("p", [b"no"], 0o644),
                        lambda: out.make_dir("p"),
                        lambda: out.make_dir("q/sub"),
                        lambda: out.make_link("p", "elsewhere")):
            with pytest.raises(ArtifactError, match="unsafe member"):
                attempt()
    assert list(outside.iterdir()) == []
    assert sorted(p.name for p in dest.iterdir()) == ["p", "q"]


def test_extract_needs_an_empty_destination(tmp_path: Path) -> None:
    path, _ = artifact.pack(_payload(tmp_path), _manifest(), tmp_path / "store")
    dest = _fresh(tmp_path / "dest")
    (dest / "lib64").symlink_to(tmp_path)
    with pytest.raises(StateError, match="not empty"):
        artifact.extract(path, dest)


# ---------------------------------------------------------------------------------------------
# Size caps and free space

MB = 1 << 20


def test_member_over_the_cap_is_refused_before_writing(tmp_path: Path) -> None:
    """An artifact holding 200 MB of zeros, against a cap lowered to 100 MB per file."""
    size = 200 * MB
    files = {"zeros": artifact.FileEntry(ra.zeros_sha256(size), size, 0o644)}
    path = ra.write(tmp_path / "big.tar.zst", [ra.file("zeros", b"")], ra.manifest_for([], files=files),
                    sizes={"zeros": size})
    assert path.stat().st_size < MB  # zeros compress well: the test writes no 200 MB file
    limits = safetar.Limits(member_bytes=100 * MB)
    dest = _fresh(tmp_path / "dest")
    with pytest.raises(ArtifactError, match="size 209715200 bytes is over the cap of 104857600") as e:
        artifact.extract(path, dest, limits=limits)
    assert e.value.exit_code == 2 and list(dest.iterdir()) == []
    assert "over the cap" in artifact.verify(path, limits=limits)[0]
    with pytest.raises(ArtifactError, match="files total 209715200 bytes, over the cap of 157286400"):
        artifact.extract(path, dest, limits=safetar.Limits(total_bytes=150 * MB))
    assert list(dest.iterdir()) == []


def test_default_caps() -> None:
    assert safetar.MAX_MEMBER_BYTES == 1 << 30 and safetar.MAX_TOTAL_BYTES == 4 << 30
    files = {f"f{i}": artifact.FileEntry("0" * 64, 1 << 30, 0o644) for i in range(5)}
    with pytest.raises(ArtifactError, match="files total 5368709120 bytes, over the cap of 4294967296"):
        safetar.MemberRules().accept_manifest(files)
    with pytest.raises(ArtifactError, match="over the cap of 1073741824 bytes per file"):
        safetar.MemberRules().accept_manifest({"f": artifact.FileEntry("0" * 64, (1 << 30) + 1, 0o644)})
    with pytest.raises(ArtifactError, match="mode 4755"):
        safetar.MemberRules().accept_manifest({"f": artifact.FileEntry("0" * 64, 1, 0o4755)})


def test_header_size_must_match_the_manifest(tmp_path: Path) -> None:
    """The manifest says 10 bytes, the tar header 200 MB (of zeros): refused at the header, before
    one byte of the member is written."""
    files = {"zeros": artifact.FileEntry(artifact.sha256_bytes(b"0123456789"), 10, 0o644)}
    path = ra.write(tmp_path / "lie.tar.zst", [ra.file("zeros", b"0123456789")],
                    ra.manifest_for([], files=files), sizes={"zeros": 200 * MB})
    dest = _fresh(tmp_path / "dest")
    with pytest.raises(ArtifactError, match="tar header size 209715200 != manifest size 10"):
        artifact.extract(path, dest)
    assert [p.name for p in dest.iterdir()] == ["manifest.json"]
    assert any("tar header size 209715200 != manifest size 10" in p for p in artifact.verify(path))


def test_free_space_is_checked_first(tmp_path: Path) -> None:
    dest = _fresh(tmp_path / "dest")
    st = os.statvfs(dest)
    claim = st.f_blocks * st.f_frsize + 1  # more than the whole filesystem: never fits
    files = {"huge": artifact.FileEntry("0" * 64, claim, 0o644)}
    path = ra.write(tmp_path / "huge.tar.zst", [], ra.manifest_for([], files=files))
    roomy = safetar.Limits(member_bytes=1 << 62, total_bytes=1 << 62)
    with pytest.raises(StateError, match=r"huge\.tar\.zst: needs \d+ bytes, .* bytes free"):
        artifact.extract(path, dest, limits=roomy)
    assert list(dest.iterdir()) == []
