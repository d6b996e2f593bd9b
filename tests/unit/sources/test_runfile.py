"""makeself header parsing and extraction on real self-extracting archives built here with
Debian's makeself (the same format as NVIDIA's .run installers). Nothing is ever executed: the
archives' startup script exits 99 and would leave a marker if it ran."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
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

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        add_members(tar, members)
    return gzip.compress(buf.getvalue(), mtime=0)


def add_members(tar: tarfile.TarFile, members: list[tuple[str, bytes | None, str | None]]) -> None:
    """(name, data, link target) each: a symbolic link when a target is given, else a regular file."""
    for name, data, link in members:
        info = tarfile.TarInfo(name)
        if link is not None:
            info.type, info.linkname = tarfile.SYMTYPE, link
            tar.addfile(info)
        else:
            info.size = len(data or b"")
            tar.addfile(info, io.BytesIO(data or b""))


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


# Issue 35, finding 7: members written through earlier members' links. Each sequence is what an
# installer's tar stream holds, in order; `{canary}` is a file outside the extraction directory.
CLIMB = "a link to '.', a link climbing through it, a regular member of that name"
LINK_SEQUENCES = {
    CLIMB: [
        ("./kernel/l1", None, "."), ("./kernel/out", None, "l1/l1/../../X"),
        ("./kernel/out", b"pwned", None)],
    "an absolute link, then a regular member of its name": [
        ("./kernel/out", None, "{canary}"), ("./kernel/out", b"pwned", None)],
    "a link to a file inside, then a regular member of its name": [
        ("./kernel/inside.c", b"keep", None), ("./kernel/out", None, "inside.c"),
        ("./kernel/out", b"pwned", None)],
    "a member under a link-named directory": [
        ("./kernel/sub/inside.c", b"keep", None), ("./kernel/d", None, "sub"),
        ("./kernel/d/inside.c", b"pwned", None)],
    "a member under a link that climbs out through a link to '.'": [
        ("./kernel/l1", None, "."), ("./kernel/up", None, "l1/l1/.."), ("./kernel/up/X", b"pwned", None)],
}


def _outside(top: Path, dest: Path) -> dict[str, bytes | str]:
    """Every entry under `top` but outside `dest`: file bytes, link targets, 'dir'."""
    seen: dict[str, bytes | str] = {}
    for p in sorted(top.rglob("*")):
        if p == dest or dest in p.parents:
            continue
        seen[str(p)] = os.readlink(p) if p.is_symlink() else "dir" if p.is_dir() else p.read_bytes()
    return seen


@pytest.mark.parametrize("sequence", list(LINK_SEQUENCES))
def test_extraction_never_writes_through_a_member_link(tmp_path: Path, sequence: str) -> None:
    """The runfile extraction follows the artifact extraction's rules (safetar): a link that leaves
    the tree is refused, and no member is written through or over an earlier link. Nothing outside
    the extraction directory changes, nothing inside is written through a link, and the refusal is
    one ArtifactError line naming the installer."""
    canary = tmp_path / "canary"
    canary.write_bytes(b"canary")
    members = [(n, d, None if t is None else t.format(canary=canary)) for n, d, t in LINK_SEQUENCES[sequence]]
    run = make_runfile(_tree(tmp_path / "src"), tmp_path / "x.run", compression="gzip", sha256=False)
    bad = _swap_payload(run, _tgz(members), tmp_path / "bad.run")
    dest = tmp_path / "a" / "out"
    dest.parent.mkdir()
    before = _outside(tmp_path, dest)
    refused: ArtifactError | None = None
    try:
        runfile.extract_tree(bad, "kernel", dest)
    except ArtifactError as e:
        refused = e
    assert _outside(tmp_path, dest) == before
    assert not (tmp_path / "X").exists() and not (tmp_path / "a" / "X").exists()
    assert canary.read_bytes() == b"canary"
    for kept in ("inside.c", "sub/inside.c"):
        assert not (dest / kept).exists() or (dest / kept).read_bytes() == b"keep"
    assert refused is not None
    msg = str(refused)
    assert msg.startswith(f"{bad}: ") and "\n" not in msg
    assert any(why in msg for why in ("leaves the tree", "without replacing or following",
                                      "not a plain directory"))


def test_build_driver_refuses_an_installer_that_writes_through_its_links(tmp_path: Path) -> None:
    """The CLI path (`build-driver --runfile`, --builder host): a valid installer whose kernel/ tree
    ends with the link sequence above is refused with one `error:` line, exit 2, no traceback, and
    nothing is written through the links (before: extracted, `X` written beside the build tree,
    and the compile run: exit 1)."""

    from click.testing import CliRunner

    from nodeprep.cli import main
    from tests.support.makeself import nvidia_tree
    from tests.unit.builder.test_runfile_userspace import fake_headers
    from tests.unit.join.conftest import build_payload

    version = "535.309.01"
    tree = nvidia_tree(build_payload(tmp_path / "us", version), tmp_path / "tree", version)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(tree, arcname=".")
        add_members(tar, LINK_SEQUENCES[CLIMB])
    run = make_runfile(tree, tmp_path / "x.run", compression="gzip", sha256=False)
    bad = _swap_payload(run, gzip.compress(buf.getvalue(), mtime=0),
                        tmp_path / f"NVIDIA-Linux-x86_64-{version}.run")
    store = tmp_path / "store"
    res = CliRunner().invoke(main, [
        "build-driver", "--builder", "host", "--headers-dir", str(fake_headers(tmp_path / "h")),
        "--store", str(store), "--cache", str(tmp_path / "cache"), "--no-smoke-test",
        "--runfile", str(bad), "--sha256", hashlib.sha256(bad.read_bytes()).hexdigest()])
    errors = [line for line in res.output.splitlines() if line.startswith("error: ")]
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert len(errors) == 1 and errors[0].endswith(
        f"NVIDIA-Linux-x86_64-{version}.run: link './kernel/l1' -> '.' leaves the tree (link target '.' is "
        "not '../'* followed by plain components (points outside the artifact or at a directory above "
        "the link))"), errors
    assert list(tmp_path.rglob("X")) == [] and not store.exists()
