"""Pack arbitrary member lists into real `.tar.zst` artifacts with a matching manifest.

`nodeprep.artifact.pack` only packs safe payloads from a directory; tests of the extraction rules
need archives an attacker would write (links through links, duplicates, devices...), so this
helper writes the tar stream member by member. Each regular file and symlink is listed in the
manifest with its real sha256 and size (the first occurrence of a name wins), so only the rules
themselves can refuse the archive.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import zstandard

from nodeprep import artifact


@dataclass(frozen=True)
class M:
    """One member: kind "file", "dir", "link" (symlink), "hard", "fifo"."""

    name: str
    kind: str = "file"
    data: bytes = b""
    target: str = ""
    mode: int = 0o644


def file(name: str, data: bytes = b"x", mode: int = 0o644) -> M:
    return M(name, "file", data=data, mode=mode)


def link(name: str, target: str) -> M:
    return M(name, "link", target=target, mode=0o777)


def directory(name: str) -> M:
    return M(name, "dir", mode=0o755)


TYPES = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "link": tarfile.SYMTYPE,
         "hard": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE}


def manifest_files(members: Iterable[M]) -> dict[str, artifact.FileEntry]:
    files: dict[str, artifact.FileEntry] = {}
    for m in members:
        if m.kind == "dir" or m.name in files:
            continue
        if m.kind == "link":
            files[m.name] = artifact.FileEntry(sha256="", size=0, mode=0o777, target=m.target)
        else:
            files[m.name] = artifact.FileEntry(
                sha256=artifact.sha256_bytes(m.data), size=len(m.data), mode=m.mode if m.mode in (
                    0o644, 0o755) else 0o644)
    return files


def manifest_for(members: Iterable[M], *, kind: str = "kmod", version: str = "535.309.01",
                 kernel: str = "6.1.0-28-amd64",
                 files: dict[str, artifact.FileEntry] | None = None) -> artifact.Manifest:
    members = list(members)
    extra = {"flavour": "proprietary", "kernel_release": kernel} if kind == "kmod" else {}
    return artifact.Manifest(kind=kind, driver_version=version, arch="amd64", os="debian-12",  # type: ignore[arg-type]
                             input_digest="e" * 64, inputs={}, files=files or manifest_files(members),
                             **extra)  # type: ignore[arg-type]


def write(dest: Path, members: Iterable[M], manifest: artifact.Manifest | None = None,
          *, sizes: dict[str, int] | None = None, raw_manifest: bytes | None = None) -> Path:
    """Write `dest` (.tar.zst): manifest.json first, then `members` in order. `sizes` overrides the
    tar header size of named regular files (their data is padded or cut to match); `raw_manifest`
    replaces the manifest's bytes (fields of any type)."""
    members = list(members)
    manifest = manifest or manifest_for(members)
    cctx = zstandard.ZstdCompressor(level=3)
    with open(dest, "wb") as raw, cctx.stream_writer(raw) as zf, \
            tarfile.open(fileobj=zf, mode="w|", format=tarfile.GNU_FORMAT) as tar:
        data = manifest.to_json() if raw_manifest is None else raw_manifest
        ti = tarfile.TarInfo(artifact.MANIFEST)
        ti.size = len(data)
        tar.addfile(ti, io.BytesIO(data))
        for m in members:
            ti = tarfile.TarInfo(m.name)
            ti.type, ti.mode, ti.linkname = TYPES[m.kind], m.mode, m.target
            if m.kind == "file":
                ti.size = (sizes or {}).get(m.name, len(m.data))
                tar.addfile(ti, io.BytesIO(m.data[: ti.size]) if ti.size <= len(m.data) else Zeros(m.data))
            else:
                tar.addfile(ti)
    return dest


class Zeros(io.RawIOBase):
    """`head` then zeros without end, streamed (a 200 MB member costs no 200 MB of memory)."""

    def __init__(self, head: bytes = b"") -> None:
        self.head = head

    def read(self, n: int = -1) -> bytes:
        out, self.head = self.head[:n], self.head[n:]
        return out + b"\0" * (n - len(out))


def zeros_sha256(size: int) -> str:
    h = hashlib.sha256()
    block = b"\0" * (1 << 20)
    for off in range(0, size, len(block)):
        h.update(block[: min(len(block), size - off)])
    return h.hexdigest()


def store_with(store: Path, artifacts: Iterable[tuple[Path, artifact.Manifest]]) -> Path:
    """A directory store holding `artifacts` (already written inside `store`) and their index."""
    entries = [artifact.IndexEntry.for_artifact(path, m) for path, m in artifacts]
    (store / artifact.INDEX).write_bytes(artifact.render_index(entries))
    return store
