"""Artifact format: determinism, verification, safe extraction, the store index."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest
import zstandard

from nodeprep import artifact
from nodeprep.errors import ArtifactError, ChecksumError


def _manifest(**kw: object) -> artifact.Manifest:
    base = dict(kind="userspace", driver_version="535.309.01", arch="amd64", os="debian-12",
                input_digest="d" * 64, inputs={"libcuda1.deb": "a" * 64})
    base.update(kw)
    return artifact.Manifest(**base)  # type: ignore[arg-type]


def _payload(tmp: Path) -> Path:
    p = tmp / "payload"
    (p / "lib64").mkdir(parents=True)
    (p / "bin").mkdir()
    (p / "lib64" / "libcuda.so.535.309.01").write_bytes(b"\x7fELF" + os.urandom(4096))
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
