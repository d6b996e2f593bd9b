"""Gzipped tarballs written member by member, for the tests of the source tarballs' unpacking (the
open kernel modules' releases, the GPUDirect companions' sources), well-formed or hostile."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

Member = tuple[str, bytes | None, str | None]  # name, file content (None: directory), link target


def write_tgz(path: Path, members: list[Member]) -> Path:
    """`path`: a .tar.gz of `members` in their order (directories 0755, files 0644, *.sh 0755)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data, link in members:
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            elif data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), 0o755 if name.endswith(".sh") else 0o644
                tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())
    return path
