"""NVIDIA `.run` installers: download (checksummed) and unpack WITHOUT executing them.

A `.run` file is a makeself self-extracting archive: a shell header followed by one or more
compressed tar streams. The header is data to us; we read from it

    skip="N"  (makeself >= 2.2)  or  `head -n N "$0"` (makeself 2.1.x, NVIDIA's installers)
              -> the payload starts after the first N lines
    filesizes="S1 S2 ..."        -> the byte length of each appended tar stream
    eval "xz -d" / "gzip -cd" / "zstd -d" / "bzip2 -d" ... -> the compression
    SHA="..." / MD5="..."        -> optional payload digests, checked when present

and decompress + untar in Python with the artifact extraction's member rules and writer
(nodeprep/safetar.py: no absolute paths, no '..', no devices or hard links, links that stay inside
the tree, nothing written through a link or over an earlier member). The kernel module tree
(kernel/ or kernel-open/) is extracted for a kmod build; the files the installer's `.manifest`
lists, for the user space (nodeprep.builder.runfileuserspace).
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import logging
import lzma
import re
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO
from urllib.parse import unquote, urlparse

import zstandard

from .. import download as dl
from ..errors import ArtifactError, ChecksumError, InputError
from ..safetar import Beneath, link_problem, name_problem
from ..vocab import DRIVER_VERSION

log = logging.getLogger(__name__)

MAX_HEADER = 256 * 1024
COMPRESSIONS = {
    "gzip -cd": "gzip",
    "gzip -d": "gzip",
    "gunzip": "gzip",
    "pigz -cd": "gzip",
    "xz -d": "xz",
    "xz -cd": "xz",
    "unxz": "xz",
    "zstd -d": "zstd",
    "zstd -cd": "zstd",
    "unzstd": "zstd",
    "bzip2 -d": "bzip2",
    "bzip2 -cd": "bzip2",
    "pbzip2 -d": "bzip2",
    "cat": "none",
}
MAGIC = {"gzip": b"\x1f\x8b", "xz": b"\xfd7zXZ\x00", "zstd": b"\x28\xb5\x2f\xfd", "bzip2": b"BZh"}


@dataclass(frozen=True)
class MakeselfHeader:
    offset: int  # byte offset of the first payload stream
    filesizes: tuple[int, ...]
    compression: str  # gzip | xz | zstd | bzip2 | none
    label: str = ""
    targetdir: str = ""
    version: str = ""  # makeself version that wrote it
    sha256: str = ""
    md5: str = ""

    @property
    def size(self) -> int:
        return sum(self.filesizes)


def _field(text: str, name: str) -> str | None:
    m = re.search(rf'^\s*{name}=(?:"([^"]*)"|(\S*))\s*$', text, re.M)
    return None if m is None else (m[1] if m[1] is not None else m[2])


def parse_header(data: bytes, *, source: str = "runfile") -> MakeselfHeader:
    """Parse the makeself header at the start of `data` (at least the header's bytes)."""
    if not data.startswith(b"#!"):
        raise InputError(f"{source}: not a makeself self-extracting archive (no #! header)")
    text = data[:MAX_HEADER].decode("latin-1")
    version = re.search(r"generated using Makeself ([\d.]+)", text)
    skip_s = _field(text, "skip")
    if skip_s is None:
        m = re.search(r'head -n "?(\d+)"? "?\$[01]"?', text)
        skip_s = m[1] if m else None
    if not skip_s or not skip_s.isdigit():
        raise InputError(f"{source}: makeself header has no payload offset (skip=/head -n)")
    skip = int(skip_s)
    lines = data.split(b"\n", skip)
    if len(lines) <= skip:
        raise InputError(f"{source}: makeself header is truncated (wants {skip} header lines)")
    offset = len(data) - len(lines[skip])
    sizes_s = _field(text, "filesizes")
    if not sizes_s or not all(s.isdigit() for s in sizes_s.split()):
        raise InputError(f"{source}: makeself header has no valid filesizes= field")
    compression = None
    for cmd in re.findall(r'\|\s*eval\s+"([^"$]+)"', text) + re.findall(
        r'^\s*eval\s+"([^"$]+)"\s*$', text, re.M
    ):
        cmd = " ".join(cmd.split())
        if cmd in COMPRESSIONS:
            compression = COMPRESSIONS[cmd]
            break
    if compression is None:
        raise InputError(f"{source}: unsupported or missing makeself compression command")
    sha = (_field(text, "SHA") or "").split()
    md5 = (_field(text, "MD5") or "").split()
    return MakeselfHeader(
        offset=offset,
        filesizes=tuple(int(s) for s in sizes_s.split()),
        compression=compression,
        label=_field(text, "label") or "",
        targetdir=_field(text, "targetdir") or "",
        version=version[1] if version else "",
        sha256=sha[0]
        if sha and sha[0] != "0000000000000000000000000000000000000000000000000000000000000000"
        else "",
        md5=md5[0] if md5 and md5[0] != "00000000000000000000000000000000" else "",
    )


def read_header(path: Path) -> MakeselfHeader:
    with open(path, "rb") as f:
        head = f.read(MAX_HEADER)
    header = parse_header(head, source=str(path))
    if header.offset + header.size > path.stat().st_size:
        raise InputError(
            f"{path}: truncated: header promises {header.size} payload bytes at offset "
            f"{header.offset}, file has {path.stat().st_size}"
        )
    return header


class _Window(io.RawIOBase):
    """A read-only view of `size` bytes of `f` starting at its current position."""

    def __init__(self, f: BinaryIO, size: int) -> None:
        self.f, self.left = f, size

    def readable(self) -> bool:
        return True

    # RawIOBase takes any writable buffer; BufferedReader, the one reader of a _Window, passes these
    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        n = min(len(b), self.left)
        if n <= 0:
            return 0
        data = self.f.read(n)
        b[: len(data)] = data
        self.left -= len(data)
        return len(data)


def _decompressed(raw: BinaryIO, compression: str) -> io.BufferedIOBase | BinaryIO:
    if compression == "gzip":
        return gzip.GzipFile(fileobj=raw)
    if compression == "xz":
        return lzma.LZMAFile(raw)
    if compression == "bzip2":
        return bz2.BZ2File(raw)
    if compression == "zstd":
        return zstandard.ZstdDecompressor().stream_reader(raw)
    return raw


def verify_payload(path: Path, header: MakeselfHeader) -> None:
    """Check the header's SHA/MD5 over the payload bytes (makeself's own integrity data)."""
    if not header.sha256 and not header.md5:
        return
    sha, md5 = hashlib.sha256(), hashlib.md5()  # noqa: S324 - makeself's format, not security
    with open(path, "rb") as f:
        f.seek(header.offset)
        left = header.size
        while left:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                break
            sha.update(chunk)
            md5.update(chunk)
            left -= len(chunk)
    if header.sha256 and sha.hexdigest() != header.sha256:
        raise ChecksumError(f"{path}: payload sha256 does not match the makeself header")
    if header.md5 and md5.hexdigest() != header.md5:
        raise ChecksumError(f"{path}: payload md5 does not match the makeself header")


def _members(path: Path, header: MakeselfHeader) -> Iterator[tuple[tarfile.TarInfo, tarfile.TarFile]]:
    with open(path, "rb") as f:
        f.seek(header.offset)
        for size in header.filesizes:
            start = f.tell()
            magic = f.read(6)
            f.seek(start)
            want = MAGIC.get(header.compression)
            if want and not magic.startswith(want):
                raise ArtifactError(f"{path}: payload at byte {start} is not {header.compression} data")
            window = io.BufferedReader(_Window(f, size))
            with tarfile.open(fileobj=_decompressed(window, header.compression), mode="r|") as tar:
                for member in tar:
                    yield member, tar
            f.seek(start + size)


def _norm(name: str) -> PurePosixPath:
    p = PurePosixPath(name)
    return PurePosixPath(*[part for part in p.parts if part not in (".", "")])


def extract_tree(path: Path, subdir: str, dest: Path) -> Path:
    """Extract `subdir` (e.g. 'kernel') of the runfile into `dest`; returns `dest`.

    Refuses absolute paths, '..', device nodes, hard links, symlinks leaving `dest`, and a member
    written through or over an earlier one (see `_extract`)."""
    prefix = PurePosixPath(subdir)

    def below(name: PurePosixPath) -> PurePosixPath | None:
        if name.parts[: len(prefix.parts)] != prefix.parts:
            return None
        return PurePosixPath(*name.parts[len(prefix.parts) :])

    if not _extract(path, dest, below):
        raise InputError(f"{path}: the installer has no {subdir}/ tree")
    return dest


def extract_files(path: Path, names: Iterable[str], dest: Path) -> Path:
    """Extract the members `names` (paths relative to the installer's top, as its `.manifest`
    names them) into `dest` at the same relative paths; InputError naming the first one missing."""
    wanted = {_norm(n) for n in names}
    found: set[PurePosixPath] = set()

    def chosen(name: PurePosixPath) -> PurePosixPath | None:
        if name in wanted:
            found.add(name)
            return name
        return None

    _extract(path, dest, chosen)
    missing = sorted(str(n) for n in wanted - found)
    if missing:
        raise InputError(f"{path.name}: .manifest lists {missing[0]}, which the installer does not hold")
    return dest


def read_manifest(path: Path) -> RunManifest:
    """The installer's own `.manifest` (nvidia-installer's list of its files), parsed."""
    header = read_header(path)
    verify_payload(path, header)
    for member, tar in _members(path, header):
        if _norm(member.name) == PurePosixPath(".manifest"):
            if not member.isreg() or member.size > MAX_MANIFEST:
                raise InputError(f"{path.name}: .manifest is not a regular file of at most {MAX_MANIFEST} "
                                 "bytes")
            src = tar.extractfile(member)
            assert src is not None
            return parse_manifest(src.read().decode("utf-8", "replace"), source=f"{path.name}: .manifest")
    raise InputError(f"{path.name}: the installer has no .manifest (not an NVIDIA driver installer?)")


def _extract(path: Path, dest: Path, select: Callable[[PurePosixPath], PurePosixPath | None]) -> int:
    """Extract the members `select` maps to a relative path (None: skipped) into `dest` (created if
    missing, must be empty); returns how many. The artifact extraction's rules and writer: names by
    safetar.name_problem, links by safetar.link_problem, regular files, directories and links only,
    written by safetar.Beneath (nothing followed or replaced), so nothing lands outside `dest`."""
    header = read_header(path)
    verify_payload(path, header)
    dest.mkdir(parents=True, exist_ok=True)
    found = 0
    with Beneath(dest) as out:
        for member, tar in _members(path, header):
            name = _norm(member.name)
            if name.is_absolute() or ".." in name.parts or member.name.startswith("/"):
                raise ArtifactError(f"{path}: unsafe member {member.name!r}")
            rel = select(name)
            if rel is None or not rel.parts:
                continue
            try:
                _write(out, member, tar, rel.as_posix())
            except ArtifactError as e:
                raise ArtifactError(f"{path}: {e}") from None
            found += 1
    return found


def _write(out: Beneath, member: tarfile.TarInfo, tar: tarfile.TarFile, rel: str) -> None:
    """One member at `rel` beneath `out`, or ArtifactError naming it and the rule it breaks."""
    problem = name_problem(rel)
    if problem is not None:
        raise ArtifactError(f"unsafe member {member.name!r}: {problem}")
    if member.isdir():
        out.make_dir(rel)
    elif member.issym():
        problem = link_problem(rel, member.linkname)
        if problem is not None:
            raise ArtifactError(f"link {member.name!r} -> {member.linkname!r} leaves the tree ({problem})")
        out.make_link(rel, member.linkname)
    elif member.isreg():
        src = tar.extractfile(member)
        assert src is not None
        out.write_file(rel, iter(lambda: src.read(1 << 20), b""), 0o755 if member.mode & 0o111 else 0o644)
    else:
        raise ArtifactError(f"unsupported member {member.name!r} (hard links, devices refused)")


# ---------------------------------------------------------------------------------------------
# The installer's `.manifest`, read as NVIDIA/nvidia-installer's parse_manifest() reads it: eight
# header lines (description, version, then six the installer ignores or derives), then one line
# per file, `FILE MODE TYPE [fields]`, the fields each type has in its manifest.c table
# (has_arch: NATIVE|COMPAT32; has_path: a path; inherit_path: INHERIT_PATH_DEPTH:N; is_symlink:
# the link's target, last). Only the types the user space takes are interpreted here; the other
# lines need their first three words.

MAX_MANIFEST = 1 << 20
HEADER_LINES = 8
FIELDS: dict[str, tuple[str, ...]] = {
    "CUDA_LIB": ("arch", "path"),
    "CUDA_SYMLINK": ("arch", "path", "target"),
    "UTILITY_LIB": ("arch",),
    "UTILITY_LIB_SYMLINK": ("arch", "target"),
    "UTILITY_BINARY": (),
    "NVIDIA_MODPROBE": ("path",),
    "FIRMWARE": ("depth",),
    "DOCUMENTATION": ("path",),
}
ARCHES = ("NATIVE", "COMPAT32")


@dataclass(frozen=True)
class ManifestEntry:
    """One file line of a `.manifest`."""

    file: str  # relative to the installer's top
    mode: int
    type: str
    arch: str = ""  # NATIVE | COMPAT32 for the types that have one
    path: str = ""  # the install path field, or the path left after INHERIT_PATH_DEPTH
    target: str = ""  # symlinks: what the link points to

    @property
    def name(self) -> str:
        return PurePosixPath(self.file).name


@dataclass(frozen=True)
class RunManifest:
    description: str
    version: str
    entries: tuple[ManifestEntry, ...]


def parse_manifest(text: str, *, source: str = ".manifest") -> RunManifest:
    """A `.manifest` (pure). InputError naming `source` and the line when it is malformed."""
    lines = text.split("\n")
    if len(lines) <= HEADER_LINES:
        raise InputError(f"{source}: fewer than {HEADER_LINES} header lines")
    description, version = lines[0].strip(), lines[1].strip()
    if not re.fullmatch(DRIVER_VERSION, version):
        raise InputError(f"{source}: line 2: {version[:80]!r} is not a driver version")
    entries = []
    for number, line in enumerate(lines[HEADER_LINES:], HEADER_LINES + 1):
        if not line.strip():
            break  # nvidia-installer stops at the first empty line
        entries.append(_entry(line.split(), f"{source}: line {number}"))
    return RunManifest(description, version, tuple(entries))


def _entry(words: list[str], where: str) -> ManifestEntry:
    if len(words) < 3:
        raise InputError(f"{where}: a file line is FILE MODE TYPE [fields]")
    file, mode_s, kind, rest = words[0], words[1], words[2], words[3:]
    name = PurePosixPath(file)
    if file.startswith("/") or ".." in name.parts or not name.name:
        raise InputError(f"{where}: {file[:80]!r} is not a path inside the installer")
    if not re.fullmatch(r"[0-7]{3,4}", mode_s):
        raise InputError(f"{where}: mode {mode_s[:20]!r} is not octal")
    fields = FIELDS.get(kind)
    if fields is None:
        return ManifestEntry(file, int(mode_s, 8), kind)
    if len(rest) < len(fields):
        raise InputError(f"{where}: {kind} needs {' '.join(fields)}")
    got = dict(zip(fields, rest, strict=False))
    if "arch" in got and got["arch"] not in ARCHES:
        raise InputError(f"{where}: architecture {got['arch'][:20]!r} is not NATIVE or COMPAT32")
    path = got.get("path", "")
    if "depth" in got:
        m = re.fullmatch(r"INHERIT_PATH_DEPTH:(\d+)", got["depth"])
        parents = name.parent.parts
        if m is None or int(m[1]) > len(parents):
            raise InputError(f"{where}: {got['depth'][:40]!r} is not INHERIT_PATH_DEPTH:N within {file}")
        path = "/".join(parents[int(m[1]) :])
    return ManifestEntry(file, int(mode_s, 8), kind, got.get("arch", ""), path, got.get("target", ""))


def runfile_name(url: str) -> str:
    name = Path(unquote(urlparse(url).path)).name
    if not name:
        raise InputError(f"--runfile: {url!r} does not name a file")
    return name


def fetch(url: str, sha256: str, cache: Path, *, progress: dl.Progress | None = None) -> Path:
    """The runfile at `url`, downloaded (resumed, retried) into `cache` and checked against `sha256`."""
    dest = cache / "runfiles" / sha256.lower() / runfile_name(url)
    # --sha256 pins the bytes independently of the server: plain http (a local mirror) needs no trust
    return dl.download(url, dest, sha256=sha256, progress=progress, insecure_http=True)
