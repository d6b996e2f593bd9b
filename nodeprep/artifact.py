"""Artifact format: deterministic `.tar.zst` files with a `manifest.json`, their verification,
safe extraction, and the store (a directory with `index.json`).

Two kinds (docs/build.md; how nodes read a store: docs/node.md, "Stores"):
- kmod:      nvidia-kmod-<driver>-<flavour>-<kernel-release>.tar.zst
             members: manifest.json, modules/<kernel-release>/*.ko
- userspace: nvidia-userspace-<driver>-<arch>.tar.zst
             members: manifest.json, lib64/..., bin/..., firmware/...

The tarball is a pure function of the payload: members sorted by path, mtime fixed, uid/gid 0,
no user/group names, modes normalised to 0755/0644 (directories 0755), zstd at a fixed level in
zstd's multi-threaded mode, whose output does not depend on the number of worker threads (it does
differ from single-threaded mode, so that is never used for artifacts).
What a member may be, and how extraction writes it, is nodeprep/safetar.py.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import io
import json
import os
import re
import shutil
import stat
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path, PurePosixPath
from typing import Any, Literal, cast, overload

import zstandard

from . import sonames, sysfs
from .atomicfile import atomic_stream, atomic_write
from .digests import CHUNK, SHA256_RE, canonical_json, sha256_bytes, sha256_file
from .errors import ArtifactError, ChecksumError, InputError
from .safetar import LIMITS, MANIFEST, Beneath, FileEntry, Limits, MemberRules, link_problem
from .vocab import DRIVER_VERSION_RE, FLAVOURS, KERNEL_RELEASE_RE

FORMAT_VERSION = 1
INDEX = "index.json"
FIXED_MTIME = 0
ZSTD_LEVEL = 10
# Part of every input digest: a change of compression changes the bytes of the same payload.
COMPRESSION = f"zstd-{ZSTD_LEVEL}-mt"

Kind = Literal["kmod", "userspace"]
# What every user space must hold, checked when it is built (nodeprep/builder/userspace.py) and
# before a node installs or activates it (nodeprep/node/complete.py): library base names
# (lib64/<name>.<driver>) with the soname the ld cache must resolve into that version, and
# binaries (bin/<name>).
REQUIRED_LIBRARIES = {"libcuda.so": "libcuda.so.1", "libnvidia-ml.so": "libnvidia-ml.so.1"}
REQUIRED_BINARIES = ("nvidia-smi",)


def input_digest(inputs: dict[str, str], params: dict[str, Any]) -> str:
    """Digest that keys a build: sha256 of every input (name -> sha256) plus the build parameters."""
    return sha256_bytes(
        canonical_json(
            {"format": FORMAT_VERSION, "compression": COMPRESSION, "inputs": inputs, "params": params}
        )
    )


@dataclass(frozen=True)
class Manifest:
    kind: Kind
    driver_version: str
    arch: str
    os: str
    input_digest: str
    # input name (e.g. "nvidia-kernel-source_535.309.01-0+deb12u1_amd64.deb") -> sha256
    inputs: dict[str, str]
    flavour: str | None = None  # kmod only: proprietary | open
    kernel_release: str | None = None  # kmod only
    vermagic: str | None = None  # kmod only
    compiler: str | None = None  # kmod only: CONFIG_CC_VERSION_TEXT of the kernel
    files: dict[str, FileEntry] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. {"smoke_test": {...}, "signing": {...}}
    format: int = FORMAT_VERSION
    nodeprep_version: str = ""

    @property
    def name(self) -> str:
        return artifact_name(self.kind, self.driver_version, arch=self.arch, flavour=self.flavour,
                             kernel_release=self.kernel_release)

    def to_json(self) -> bytes:
        data = asdict(self)
        data["files"] = {k: {kk: vv for kk, vv in asdict(v).items() if vv is not None}
                         for k, v in sorted(self.files.items())}
        return json.dumps(data, sort_keys=True, indent=2).encode() + b"\n"

    @classmethod
    def from_json(cls, raw: bytes | str, *, source: str = MANIFEST) -> Manifest:
        """The manifest in `raw`; ArtifactError naming `source` and the first bad field when it is
        not JSON or a field has the wrong type or value (a manifest comes from the store: hostile)."""
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise MalformedManifest(f"{source}: malformed manifest ({str(e)[:200]})") from None
        if isinstance(data, dict) and "format" in data and data["format"] != FORMAT_VERSION:
            raise MalformedManifest(f"{source}: manifest format {_shown(data['format'])} is not supported "
                                f"(this nodeprep reads format {FORMAT_VERSION})")
        try:
            return _manifest(data)
        except _Bad as e:
            raise MalformedManifest(f"{source}: malformed manifest ({e})") from None


class MalformedManifest(ArtifactError):
    """A manifest that is not one this nodeprep reads (not JSON, a field of the wrong type or value,
    another format): a refused input everywhere, also for `artifacts verify` (exit 2)."""


class _Bad(Exception):
    """A manifest field of the wrong type or value (the message names it)."""


def _typed(data: dict[str, Any], key: str, kinds: tuple[type, ...], default: Any = _Bad) -> Any:
    """data[key] when it is one of `kinds` (bool is no int), `default` when absent."""
    if key not in data:
        if default is _Bad:
            raise _Bad(f"{key}: required")
        return default
    value = data[key]
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
        raise _Bad(f"{key}: expected {names}, got {_shown(value)}")
    return value


@overload
def _text(data: dict[str, Any], key: str, pattern: re.Pattern[str] | None = None, *,
          optional: Literal[False] = False) -> str: ...
@overload
def _text(data: dict[str, Any], key: str, pattern: re.Pattern[str] | None = None, *,
          optional: Literal[True]) -> str | None: ...
def _text(data: dict[str, Any], key: str, pattern: re.Pattern[str] | None = None, *,
          optional: bool = False) -> str | None:
    kinds = (str, type(None)) if optional else (str,)
    value: str | None = _typed(data, key, kinds, None if optional else _Bad)
    if value is not None and (not value.isprintable() or (pattern and not pattern.fullmatch(value))):
        raise _Bad(f"{key}: {_shown(value)} is not valid here")
    return value


def _str_map(data: dict[str, Any], key: str) -> dict[str, str]:
    value: dict[str, str] = _typed(data, key, (dict,), {})
    for k, v in value.items():
        if not isinstance(v, str):
            raise _Bad(f"{key}.{_shown(k)}: expected str, got {_shown(v)}")
    return value


_ENTRY_KEYS = {"sha256", "size", "mode", "target"}


def _file_entry(name: str, raw: Any) -> FileEntry:
    where = f"files.{_shown(name)}"
    if not isinstance(raw, dict):
        raise _Bad(f"{where}: expected a mapping, got {_shown(raw)}")
    unknown = sorted(set(raw) - _ENTRY_KEYS)
    if unknown:
        raise _Bad(f"{where}: unknown field {_shown(unknown[0])}")
    try:
        target = _typed(raw, "target", (str, type(None)), None)
        sha = _typed(raw, "sha256", (str,))
        size, mode = _typed(raw, "size", (int,)), _typed(raw, "mode", (int,))
    except _Bad as e:
        raise _Bad(f"{where}.{e}") from None
    if target is None and not SHA256_RE.fullmatch(sha):
        raise _Bad(f"{where}.sha256: {_shown(sha)} is not 64 lower-case hex digits")
    if not 0 <= size < 1 << 63 or not 0 <= mode <= 0o7777:
        raise _Bad(f"{where}: size {size} or mode {mode} out of range")
    return FileEntry(sha256=sha, size=size, mode=mode, target=target)


def _manifest(data: Any) -> Manifest:
    if not isinstance(data, dict):
        raise _Bad(f"expected a JSON object, got {_shown(data)}")
    known = {f.name for f in fields(Manifest)}
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        raise _Bad(f"unknown field {_shown(unknown[0])}")
    kind = _text(data, "kind")
    if kind not in ("kmod", "userspace"):
        raise _Bad(f"kind: {_shown(kind)} is not kmod or userspace")
    files = _typed(data, "files", (dict,), {})
    return Manifest(
        kind=cast(Kind, kind),  # checked above
        driver_version=_text(data, "driver_version", DRIVER_VERSION_RE),
        arch=_text(data, "arch"),
        os=_text(data, "os"),
        input_digest=_text(data, "input_digest"),
        inputs=_str_map(data, "inputs"),
        flavour=_text(data, "flavour", optional=True),
        kernel_release=_text(data, "kernel_release", KERNEL_RELEASE_RE, optional=True),
        vermagic=_text(data, "vermagic", optional=True),
        compiler=_text(data, "compiler", optional=True),
        files={name: _file_entry(name, raw) for name, raw in files.items()},
        extra=_typed(data, "extra", (dict,), {}),
        format=_typed(data, "format", (int,), FORMAT_VERSION),
        nodeprep_version=_typed(data, "nodeprep_version", (str,), ""),
    )


def artifact_name(kind: Kind, driver_version: str, *, arch: str = "amd64", flavour: str | None = None,
                  kernel_release: str | None = None) -> str:
    if kind == "kmod":
        if not flavour or not kernel_release:
            raise ValueError("kmod artifacts need flavour and kernel_release")
        return f"nvidia-kmod-{driver_version}-{flavour}-{kernel_release}.tar.zst"
    return f"nvidia-userspace-{driver_version}-{arch}.tar.zst"


# ---------------------------------------------------------------------------------------------
# Packing


def _walk(payload: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(payload):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            if p.is_dir() and not p.is_symlink():
                continue
            yield p


def scan_payload(payload: Path) -> dict[str, FileEntry]:
    """FileEntry for every regular file and symlink under `payload` (relative POSIX paths)."""
    files: dict[str, FileEntry] = {}
    for p in _walk(payload):
        rel = p.relative_to(payload).as_posix()
        if rel == MANIFEST:
            raise ArtifactError(f"payload must not contain {MANIFEST}")
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(p)
            problem = link_problem(rel, target)
            if problem:
                raise ArtifactError(f"{rel}: {problem}")
            files[rel] = FileEntry(sha256="", size=0, mode=0o777, target=target)
        elif stat.S_ISREG(st.st_mode):
            mode = 0o755 if st.st_mode & 0o111 else 0o644
            files[rel] = FileEntry(sha256=sha256_file(p), size=st.st_size, mode=mode)
        else:
            raise ArtifactError(f"{rel}: only regular files and symlinks may be packed")
    return files


def _tarinfo(name: str, *, size: int = 0, mode: int = 0o644, kind: bytes = tarfile.REGTYPE,
             linkname: str = "") -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode, ti.type, ti.linkname = size, mode, kind, linkname
    ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = FIXED_MTIME, 0, 0, "", ""
    return ti


def compressor(threads: int | None = None) -> zstandard.ZstdCompressor:
    """The artifacts' zstd compressor: multi-threaded mode with `threads` workers (default: one
    per CPU); the bytes are the same for any number of workers >= 1."""
    workers = threads if threads is not None else (os.cpu_count() or 1)
    return zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True, threads=max(1, workers))


def pack(
    payload: Path, manifest: Manifest, dest_dir: Path, *, threads: int | None = None
) -> tuple[Path, Manifest]:
    """Write `<dest_dir>/<manifest.name>` from `payload`; returns its path and the final manifest.

    The manifest's `files` is filled from the payload. The file appears atomically (temp + rename).
    `threads`: zstd workers (default: one per CPU; the bytes do not depend on it).
    """
    files = scan_payload(payload)
    manifest = replace(manifest, files=files)
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / manifest.name
    dirs = sorted({str(PurePosixPath(p).parent) for p in files} - {"."})
    all_dirs = sorted({str(a) for d in dirs for a in [PurePosixPath(d), *PurePosixPath(d).parents]} - {"."})
    with atomic_stream(dest) as raw:
        cctx = compressor(threads)
        with cctx.stream_writer(raw, closefd=False) as zf, \
                tarfile.open(fileobj=zf, mode="w|", format=tarfile.GNU_FORMAT) as tar:
            data = manifest.to_json()
            tar.addfile(_tarinfo(MANIFEST, size=len(data)), io.BytesIO(data))
            for d in all_dirs:
                tar.addfile(_tarinfo(d + "/", mode=0o755, kind=tarfile.DIRTYPE))
            for rel, entry in sorted(files.items()):
                if entry.target is not None:
                    tar.addfile(_tarinfo(rel, mode=0o777, kind=tarfile.SYMTYPE, linkname=entry.target))
                else:
                    with open(payload / rel, "rb") as f:
                        tar.addfile(_tarinfo(rel, size=entry.size, mode=entry.mode), f)
    return dest, manifest


# ---------------------------------------------------------------------------------------------
# Reading, verification, safe extraction


def _open_tar(path: Path) -> Iterator[tuple[tarfile.TarInfo, tarfile.TarFile]]:
    try:
        with open(path, "rb") as raw:
            dctx = zstandard.ZstdDecompressor()
            with dctx.stream_reader(raw) as zr, tarfile.open(fileobj=zr, mode="r|") as tar:
                for member in tar:
                    yield member, tar
    except (tarfile.TarError, zstandard.ZstdError, EOFError) as e:
        raise ArtifactError(f"{path}: not a valid .tar.zst artifact ({e})") from None


def read_manifest(path: Path) -> Manifest:
    """The manifest of artifact `path` (its first member)."""
    for member, tar in _open_tar(path):
        if member.name != MANIFEST:
            break
        f = tar.extractfile(member)
        assert f is not None
        return Manifest.from_json(f.read(), source=f"{path}:{MANIFEST}")
    raise ArtifactError(f"{path}: first member is not {MANIFEST}")


def read_member(path: Path, name: str, *, limit: int = 16 << 20) -> bytes | None:
    """The bytes of payload file `name` of artifact `path`, checked against its manifest entry
    (None when the artifact has no such file); nothing is written."""
    manifest: Manifest | None = None
    for member, tar in _open_tar(path):
        if manifest is None:
            if member.name != MANIFEST:
                raise ArtifactError(f"{path}: first member is not {MANIFEST}")
            f = tar.extractfile(member)
            assert f is not None
            manifest = Manifest.from_json(f.read(), source=f"{path}:{MANIFEST}")
            if name not in manifest.files:
                return None
            continue
        if member.name != name:
            continue
        entry = manifest.files[name]
        if not member.isfile() or member.size != entry.size or member.size > limit:
            raise ArtifactError(f"{path}: {name} does not match its manifest entry")
        f = tar.extractfile(member)
        assert f is not None
        data = f.read()
        if sha256_bytes(data) != entry.sha256:
            raise ChecksumError(f"{path}: {name} does not match its manifest sha256")
        return data
    return None


def verify(path: Path, *, limits: Limits = LIMITS) -> list[str]:
    """Problems found in artifact `path` (empty list: it is intact), by the rules `extract` applies
    (safetar.MemberRules) plus every file's sha256. A manifest it cannot read is a refused input,
    not a problem: MalformedManifest naming the file and field, as install refuses it."""
    problems: list[str] = []
    rules = MemberRules(limits)
    try:
        for member, tar in _open_tar(path):
            first = not rules.started
            try:
                name = rules.check(member)
                if first:
                    rules.accept_manifest(_load_manifest(tar, member, f"{path}:{MANIFEST}")[0].files)
                    continue
            except MalformedManifest:
                raise
            except ArtifactError as e:
                problems.append(str(e))
                if first:
                    return problems
                continue
            if member.isreg():
                spool = sonames.Spool(name)
                problem = rules.checksum_problem(name, _sha256_stream(tar, member, spool.write))
                problems += [p for p in (problem, spool.problem()) if p]
    except MalformedManifest:
        raise
    except ArtifactError as e:
        problems.append(str(e))
        return problems
    except (tarfile.TarError, zstandard.ZstdError, EOFError) as e:
        problems.append(f"corrupt archive data ({e})")
        return problems
    if not rules.started:
        return problems or ["empty artifact"]
    problems += [f"{name}: listed in the manifest but missing" for name in rules.missing()]
    return problems


def _load_manifest(tar: tarfile.TarFile, member: tarfile.TarInfo, source: str) -> tuple[Manifest, bytes]:
    f = tar.extractfile(member)
    assert f is not None
    data = f.read()
    return Manifest.from_json(data, source=source), data


def _sha256_stream(tar: tarfile.TarFile, member: tarfile.TarInfo, sink: Any = None) -> str:
    """The member's sha256; `sink(chunk)`, when given, sees its bytes too."""
    f = tar.extractfile(member)
    assert f is not None
    h = hashlib.sha256()
    for chunk in iter(functools.partial(f.read, CHUNK), b""):
        h.update(chunk)
        if sink is not None:
            sink(chunk)
    return h.hexdigest()


def extract(path: Path, dest: Path, *, limits: Limits = LIMITS) -> Manifest:
    """Extract artifact `path` into the existing, empty directory `dest`.

    Every member passes safetar.MemberRules (the rules `verify` applies) before anything of it is
    written, and is then written beneath a directory fd of `dest` without following any symlink
    (safetar.Beneath); every file's sha256 is checked against the manifest. The manifest's total
    must fit the free space of `dest` (StateError otherwise)."""
    try:
        return _extract(path, dest, limits)
    except (tarfile.TarError, zstandard.ZstdError, EOFError) as e:
        raise ArtifactError(f"{path}: corrupt archive data ({e})") from None


def _extract(path: Path, dest: Path, limits: Limits) -> Manifest:
    rules = MemberRules(limits)
    manifest: Manifest | None = None
    with Beneath(dest) as out:
        for member, tar in _open_tar(path):
            try:
                name = rules.check(member)
                if manifest is None:
                    manifest, data = _load_manifest(tar, member, f"{path}:{MANIFEST}")
                    rules.accept_manifest(manifest.files)
                    out.check_space(len(data) + rules.total_bytes, what=path.name)
                    out.write_file(MANIFEST, [data], 0o644)
                    continue
                if member.isdir():
                    out.make_dir(name)
                elif member.issym():
                    out.make_link(name, member.linkname)
                else:
                    f = tar.extractfile(member)
                    assert f is not None
                    h = hashlib.sha256()
                    out.write_file(name, _hashing(iter(functools.partial(f.read, CHUNK), b""), h),
                                   rules.mode(name))
                    problem = rules.checksum_problem(name, h.hexdigest())
                    if problem:
                        raise ChecksumError(f"{path}: {problem}")
                    _check_soname(out, name)
            except ChecksumError:
                raise
            except ArtifactError as e:
                raise ArtifactError(f"{path}: {e}") from None
    if manifest is None:
        raise ArtifactError(f"{path}: empty artifact")
    missing = rules.missing()
    if missing:
        raise ArtifactError(f"{path}: manifest lists files missing from the archive: "
                            f"{', '.join(missing[:5])}")
    return manifest


def _check_soname(out: Beneath, name: str) -> None:
    """sonames.read on the file just written."""
    fd = out.open_file(name)
    try:
        sonames.read(name, fd)
    finally:
        os.close(fd)


def _hashing(chunks: Iterator[bytes], h: Any) -> Iterator[bytes]:
    for chunk in chunks:
        h.update(chunk)
        yield chunk


# ---------------------------------------------------------------------------------------------
# Store


@dataclass(frozen=True)
class IndexEntry:
    name: str
    kind: Kind
    driver_version: str
    arch: str
    os: str
    sha256: str
    size: int
    input_digest: str
    flavour: str | None = None
    kernel_release: str | None = None
    vermagic: str | None = None

    @classmethod
    def for_artifact(cls, path: Path, manifest: Manifest) -> IndexEntry:
        return cls(name=path.name, kind=manifest.kind, driver_version=manifest.driver_version,
                   arch=manifest.arch, os=manifest.os, sha256=sha256_file(path), size=path.stat().st_size,
                   input_digest=manifest.input_digest, flavour=manifest.flavour,
                   kernel_release=manifest.kernel_release, vermagic=manifest.vermagic)


TOKEN_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")  # an index's arch and os
MAX_INDEX = 64 << 20  # bytes of an index.json, read from a directory or over the network alike
MAX_VERMAGIC = 1024
_ENTRY_FIELDS = tuple(IndexEntry.__dataclass_fields__)
_OPTIONAL = {"flavour", "kernel_release", "vermagic"}


def _shown(value: Any) -> str:
    """A hostile value in an error line: repr (no newline, no NUL), at most 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


_RULES: dict[str, tuple[Any, str]] = {
    "name": (lambda v: True, ""),  # checked against the other fields (index_entry)
    "kind": (lambda v: v in ("kmod", "userspace"), "is not kmod or userspace"),
    "driver_version": (DRIVER_VERSION_RE.fullmatch, "is not a driver version"),
    "arch": (TOKEN_RE.fullmatch, "is not an architecture name"),
    "os": (TOKEN_RE.fullmatch, "is not an OS name"),
    "sha256": (SHA256_RE.fullmatch, "is not a sha256 hex digest"),
    "input_digest": (SHA256_RE.fullmatch, "is not a sha256 hex digest"),
    "flavour": (lambda v: v in FLAVOURS, f"is not one of {', '.join(FLAVOURS)}"),
    "kernel_release": (KERNEL_RELEASE_RE.fullmatch, "is not a kernel release"),
    "vermagic": (lambda v: len(v) <= MAX_VERMAGIC and v.isprintable(), "is not a vermagic string"),
}


def _field_problem(key: str, value: Any) -> str | None:
    """Why `value` is not a valid index field `key` (None: it is)."""
    if key == "size":
        return None if type(value) is int and 0 <= value < 1 << 63 else "is not a size in bytes"
    if value is None:
        return None if key in _OPTIONAL else "is required"
    if not isinstance(value, str):
        return "is not a string"
    check, why = _RULES[key]
    return None if check(value) else why


def index_entry(item: Any, where: str) -> IndexEntry:
    """One entry of an index's `artifacts`, every field type-checked; its name must be the one
    `artifact_name` gives its fields (a single file-name component: names are data, never paths).
    ArtifactError names the field (`where` is e.g. `index.json: artifacts[3]`)."""
    if not isinstance(item, dict):
        raise ArtifactError(f"{where}: not an object")
    unknown = sorted(str(k) for k in item if k not in _ENTRY_FIELDS)
    if unknown:
        raise ArtifactError(f"{where}: unknown field {_shown(unknown[0])}")
    for key in _ENTRY_FIELDS:
        problem = _field_problem(key, item.get(key))
        if problem:
            raise ArtifactError(f"{where}.{key}: {_shown(item.get(key))} {problem}")
    entry = IndexEntry(**item)
    if entry.kind == "kmod" and (entry.flavour is None or entry.kernel_release is None):
        raise ArtifactError(f"{where}: a kmod entry needs flavour and kernel_release")
    expected = artifact_name(entry.kind, entry.driver_version, arch=entry.arch, flavour=entry.flavour,
                             kernel_release=entry.kernel_release)
    if entry.name != expected:
        raise ArtifactError(f"{where}.name: {_shown(entry.name)} is not the artifact's name ({expected}); "
                            f"a store's names are file names, never paths")
    return entry


def parse_index(raw: bytes | str, *, source: str) -> list[IndexEntry]:
    """The entries of a store index (`index.json`), every field checked (`index_entry`), names
    unique. ArtifactError (a refused input) for anything else, naming `source` and the field."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise ArtifactError(f"{source}: malformed store index ({str(e)[:200]})") from None
    if not isinstance(data, dict):
        raise ArtifactError(f"{source}: malformed store index (not an object)")
    if data.get("format") != FORMAT_VERSION or type(data.get("format")) is not int:
        raise ArtifactError(f"{source}: index format {_shown(data.get('format'))} is not supported")
    items = data.get("artifacts")
    if not isinstance(items, list):
        raise ArtifactError(f"{source}: artifacts: not a list")
    entries = [index_entry(item, f"{source}: artifacts[{i}]") for i, item in enumerate(items)]
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        if entry.name in seen:
            raise ArtifactError(f"{source}: artifacts[{i}].name: {entry.name} is listed twice")
        seen.add(entry.name)
    return entries


def read_index(directory: Path) -> list[IndexEntry] | None:
    """The entries of the directory store's index.json (None when it has none), read as a regular
    file of at most MAX_INDEX bytes without following a symbolic link."""
    path = directory / INDEX
    try:
        raw = sysfs.read_bytes(path, limit=MAX_INDEX)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except sysfs.UnsafeFile as e:
        raise ArtifactError(f"{path}: {e.strerror}; a store index must be a regular file") from None
    except OSError as e:
        raise InputError(f"{path}: cannot be read ({e.strerror})") from None
    return parse_index(raw, source=str(path))


def file_name(name: str) -> str:
    """`name` when it is one plain file-name component (no `/` or NUL, not `.`, `..` or hidden, at
    most 255 bytes); ArtifactError otherwise. A store's names are data, never paths."""
    if (not isinstance(name, str) or name.startswith(".") or "/" in name or "\0" in name
            or not 0 < len(name.encode("utf-8", "surrogateescape")) <= 255):
        raise ArtifactError(f"{_shown(name)} is not an artifact file name (a store's names are never paths)")
    return name


def sha256_listed(directory: Path, name: str) -> str | None:
    """sha256 of the artifact file `name` (an index name) of a directory store, opened as a regular
    file without following a symbolic link; None when there is none. ArtifactError when `name` is
    not a plain file name or the file is not a regular file."""
    path = directory / file_name(name)
    try:
        fd = sysfs.open_regular(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except sysfs.UnsafeFile as e:
        raise ArtifactError(f"{path}: {e.strerror}; a store's artifacts must be regular files") from None
    h = hashlib.sha256()
    with os.fdopen(fd, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def render_index(entries: Iterable[IndexEntry]) -> bytes:
    items = sorted((asdict(e) for e in entries), key=lambda e: e["name"])
    return json.dumps({"format": FORMAT_VERSION, "artifacts": items},
                      sort_keys=True, indent=2).encode() + b"\n"


def find(entries: Iterable[IndexEntry], kind: Kind, driver_version: str, *, flavour: str | None = None,
         kernel_release: str | None = None, arch: str | None = None) -> IndexEntry | None:
    for e in entries:
        if e.kind != kind or e.driver_version != driver_version:
            continue
        if flavour and e.flavour != flavour:
            continue
        if kernel_release and e.kernel_release != kernel_release:
            continue
        if arch and e.arch != arch:
            continue
        return e
    return None


class LocalStore:
    """A store directory: artifacts plus index.json. Publishing is atomic per file and the index
    is rewritten with a temp file + rename under an flock, so concurrent builds (-j N) are safe."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def _lock(self) -> Any:
        self.path.mkdir(parents=True, exist_ok=True)
        f = open(self.path / ".lock", "w")  # noqa: SIM115
        fcntl.flock(f, fcntl.LOCK_EX)
        return f

    def entries(self) -> list[IndexEntry]:
        entries = read_index(self.path)
        if entries is None:
            if not self.path.is_dir():
                raise InputError(f"{self.path}: store directory does not exist")
            return []
        return entries

    def lookup(self, name: str) -> IndexEntry | None:
        return next((e for e in self.entries() if e.name == name), None)

    def publish(self, artifact: Path, manifest: Manifest) -> IndexEntry:
        """Move `artifact` (already written in a temp location on any filesystem) into the store."""
        with self._lock():
            dest = self.path / manifest.name
            if artifact.resolve() != dest.resolve():
                with atomic_stream(dest) as out, open(artifact, "rb") as src:
                    shutil.copyfileobj(src, out, CHUNK)
            entry = IndexEntry.for_artifact(dest, manifest)
            entries = [e for e in self.entries() if e.name != entry.name] + [entry]
            self._write_index(entries)
            return entry

    def _write_index(self, entries: list[IndexEntry]) -> None:
        atomic_write(self.path / INDEX, render_index(entries))
