"""makeself header parsing and extraction on real self-extracting archives built here with
Debian's makeself (the same format as NVIDIA's .run installers). Nothing is ever executed: the
archives' startup script exits 99 and would leave a marker if it ran."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from nodeprep.errors import ArtifactError, ChecksumError, InputError
from nodeprep.sources import runfile
from tests.support.makeself import make_runfile


def _tree(root: Path) -> Path:
    pkg = root / "NVIDIA-Linux-x86_64-535.309.01"
    (pkg / "kernel" / "nvidia").mkdir(parents=True)
    (pkg / "kernel-open" / "nvidia").mkdir(parents=True)
    (pkg / "kernel" / "Kbuild").write_text("obj-m += nvidia.o\n")
    (pkg / "kernel" / "nvidia" / "nv.c").write_text("int nv;\n")
    (pkg / "kernel" / "conftest.sh").write_text("#!/bin/sh\n")
    (pkg / "kernel" / "conftest.sh").chmod(0o755)
    os.symlink("nvidia/nv.c", pkg / "kernel" / "nv-link.c")
    (pkg / "kernel" / "nv-kernel.o_binary").write_bytes(os.urandom(200_000))
    (pkg / "kernel-open" / "nvidia" / "open.c").write_text("int open_nv;\n")
    (pkg / "nvidia-smi").write_bytes(b"\x7fELF not needed")
    return pkg


@pytest.mark.parametrize("compression", ["xz", "gzip", "zstd", "bzip2"])
def test_parse_and_extract_kernel_tree(tmp_path, compression):
    pkg = _tree(tmp_path / "src")
    run = make_runfile(pkg, tmp_path / "NVIDIA-Linux-x86_64-535.309.01.run", compression=compression)
    header = runfile.read_header(run)
    assert header.compression == compression
    assert header.version == "2.4.5" or header.version.startswith("2.")
    assert header.label.endswith("535.309.01")
    assert header.offset + header.size == run.stat().st_size
    with open(run, "rb") as f:
        f.seek(header.offset)
        assert hashlib.sha256(f.read()).hexdigest() == header.sha256
    out = runfile.extract_tree(run, "kernel", tmp_path / "out")
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        "Kbuild",
        "conftest.sh",
        "nv-kernel.o_binary",
        "nv-link.c",
        "nvidia",
        "nvidia/nv.c",
    ]
    assert (out / "nv-kernel.o_binary").read_bytes() == (pkg / "kernel" / "nv-kernel.o_binary").read_bytes()
    assert os.access(out / "conftest.sh", os.X_OK) and not os.access(out / "Kbuild", os.X_OK)
    assert os.readlink(out / "nv-link.c") == "nvidia/nv.c"
    opened = runfile.extract_tree(run, "kernel-open", tmp_path / "open")
    assert [p.name for p in opened.rglob("*.c")] == ["open.c"]


def test_flipped_payload_byte_fails_the_header_checksum(tmp_path):
    run = make_runfile(_tree(tmp_path / "src"), tmp_path / "x.run")
    header = runfile.read_header(run)
    data = bytearray(run.read_bytes())
    data[header.offset + header.size // 2] ^= 0xFF
    run.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match="does not match the makeself header"):
        runfile.extract_tree(run, "kernel", tmp_path / "out")


def test_truncated_and_foreign_files(tmp_path):
    run = make_runfile(_tree(tmp_path / "src"), tmp_path / "x.run")
    cut = tmp_path / "cut.run"
    cut.write_bytes(run.read_bytes()[:-1000])
    with pytest.raises(InputError, match="truncated"):
        runfile.read_header(cut)
    elf = tmp_path / "elf.run"
    elf.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 100)
    with pytest.raises(InputError, match="not a makeself"):
        runfile.read_header(elf)
    with pytest.raises(InputError, match="no kernel-missing/ tree"):
        runfile.extract_tree(run, "kernel-missing", tmp_path / "none")


def test_makeself_21_header_style():
    """NVIDIA's installers use makeself 2.1.x: no skip= field, the offset comes from `head -n N`.
    This header is written in that format by hand (field names and layout as in those files)."""
    header = (
        "#!/bin/sh\n"
        "# This script was generated using Makeself 2.1.5\n"
        'CRCsum="1234"\nMD5="00000000000000000000000000000000"\nTMPROOT=${TMPDIR:=/tmp}\n\n'
        'label="NVIDIA Accelerated Graphics Driver for Linux-x86_64 535.309.01"\n'
        'script="./nvidia-installer"\nscriptargs=""\ntargetdir="NVIDIA-Linux-x86_64-535.309.01"\n'
        'filesizes="5"\nkeep=y\n\n'
        'MS_Check() {\n    offset=`head -n 18 "$1" | wc -c | tr -d " "`\n}\n'
        'MS_dd "$0" $offset $s | eval "xz -d" | ( cd "$tmpdir"; UnTAR x )\n'
        "exit 0\n"
    )
    assert header.count("\n") == 18
    data = header.encode() + b"\xfd7zXZ"
    h = runfile.parse_header(data)
    assert (h.offset, h.filesizes, h.compression, h.md5, h.sha256) == (
        len(header.encode()),
        (5,),
        "xz",
        "",
        "",
    )
    assert h.targetdir == "NVIDIA-Linux-x86_64-535.309.01"


def _swap_payload(run: Path, payload: bytes, dest: Path) -> Path:
    """The same makeself header (same line count) with another gzip payload and no digests."""
    header = runfile.read_header(run)
    text = run.read_bytes()[: header.offset].decode("latin-1")
    old = f'filesizes="{header.filesizes[0]}"'
    assert old in text
    text = text.replace(old, f'filesizes="{len(payload)}"')
    text = text.replace(f'MD5="{header.md5}"', 'MD5="00000000000000000000000000000000"')
    dest.write_bytes(text.encode("latin-1") + payload)
    return dest


def _tgz(members: list[tuple[str, bytes | None, str | None]]) -> bytes:
    import gzip
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data, link in members:
            ti = tarfile.TarInfo(name)
            if link is not None:
                ti.type, ti.linkname = tarfile.SYMTYPE, link
                tar.addfile(ti)
            else:
                ti.size = len(data or b"")
                tar.addfile(ti, io.BytesIO(data or b""))
    return gzip.compress(buf.getvalue(), mtime=0)


@pytest.mark.parametrize(
    "members, problem",
    [
        ([("./kernel/../../evil", b"x", None)], "unsafe member"),
        ([("./kernel/link", None, "../../../etc/passwd")], "leaves the tree"),
        ([("./kernel/abs", None, "/etc/passwd")], "leaves the tree"),
    ],
)
def test_unsafe_members_are_refused(tmp_path, members, problem):
    run = make_runfile(_tree(tmp_path / "src"), tmp_path / "x.run", compression="gzip", sha256=False)
    bad = _swap_payload(run, _tgz(members), tmp_path / "bad.run")
    with pytest.raises(ArtifactError, match=problem):
        runfile.extract_tree(bad, "kernel", tmp_path / "out")
    assert not (tmp_path / "evil").exists()


def test_runfile_name():
    assert (
        runfile.runfile_name("http://127.0.0.1:8000/x/NVIDIA-Linux-x86_64-535.309.01.run")
        == "NVIDIA-Linux-x86_64-535.309.01.run"
    )
    with pytest.raises(InputError):
        runfile.runfile_name("http://127.0.0.1:8000/")
