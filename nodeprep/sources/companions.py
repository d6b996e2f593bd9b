"""NVIDIA's GPUDirect companion module sources: gds-nvidia-fs (nvidia-fs.ko, GPUDirect Storage) and
gdrcopy (gdrdrv.ko, GPUDirect RDMA copies), each a release tarball (GitHub's tag archive or a
`git archive` of the tag: one top directory `<project>-<version>/`).

Pinned inputs like an open-source release: URL or path plus sha256 (checked before use), cached
under `<cache>/companions/<sha256>/`, hostile input unpacked by opensource.extract_top_dir's rules
(regular files and directories below the one top directory, nothing else).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from .. import download as dl
from ..errors import InputError
from . import opensource


@dataclass(frozen=True)
class Companion:
    """One companion kernel module: where its kbuild directory is in its project's tarball."""

    name: str  # the option and profile name, e.g. "gdrdrv"
    project: str  # the tarball's name and top directory stem, e.g. "gdrcopy"
    subdir: str  # the kbuild directory below the top directory
    module: str  # the .ko it builds, without .ko
    option: str  # the build-driver option naming its tarball


COMPANIONS: dict[str, Companion] = {
    "nvidia-fs": Companion("nvidia-fs", "gds-nvidia-fs", "src", "nvidia-fs", "--nvidia-fs"),
    "gdrdrv": Companion("gdrdrv", "gdrcopy", "src/gdrdrv", "gdrdrv", "--gdrcopy"),
}
VERSION = r"\d+\.\d+(?:\.\d+)?"


def archive_name(url: str, option: str) -> str:
    name = Path(unquote(urlparse(url).path)).name
    if not name:
        raise InputError(f"{option}: {url!r} does not name a file")
    return name


def name_version(companion: Companion, name: str) -> str | None:
    """The version a tarball's file name carries ('gdrcopy-2.6.tar.gz' -> '2.6'), or None."""
    m = re.match(rf"^{re.escape(companion.project)}-v?({VERSION})\.(?:tar(?:\.\w+)?|tgz)$", name)
    return m[1] if m else None


def check_name(companion: Companion, url: str) -> str:
    """The version of `companion`'s tarball from its file name; InputError for another project's."""
    name = archive_name(url, companion.option)
    version = name_version(companion, name)
    if version is None:
        raise InputError(f"{companion.option}: {name} is not a {companion.project}-<version>.tar.gz release")
    return version


def fetch(companion: Companion, url: str, sha256: str, cache: Path, *,
          progress: dl.Progress | None = None) -> Path:
    """The tarball at `url` (URL or path), downloaded into `cache` and checked against `sha256`."""
    check_name(companion, url)
    dest = cache / "companions" / sha256.lower() / archive_name(url, companion.option)
    return dl.download(url, dest, sha256=sha256, progress=progress, insecure_http=True)


def extract(companion: Companion, path: Path, dest: Path) -> Path:
    """Unpack `path` as `dest` (a new directory); returns the kbuild directory inside it.
    InputError when the top directory is not `<project>-<version>` of the file name's version or
    the kbuild directory has no Makefile."""
    version = check_name(companion, path.name)

    def top_ok(p: Path, top: str) -> None:
        if top not in (f"{companion.project}-{version}", f"{companion.project}-v{version}"):
            raise InputError(f"{p.name}: top directory {top!r} is not {companion.project}-{version}")

    opensource.extract_top_dir(path, dest, top_ok)
    kdir = dest / companion.subdir
    if not (kdir / "Makefile").is_file():
        raise InputError(f"{path.name}: no {companion.subdir}/Makefile (not a {companion.project} release)")
    return kdir
