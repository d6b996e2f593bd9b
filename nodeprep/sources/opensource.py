"""NVIDIA open-gpu-kernel-modules releases: download (checksummed), read the version, unpack.

A release tarball (`open-gpu-kernel-modules-<version>.tar.gz`, GitHub's release archive or a
`git archive` of the tag) holds one top directory `open-gpu-kernel-modules-<version>/` with the
top-level Makefile (`make modules` builds src/nvidia, src/nvidia-modeset, then kbuild in
kernel-open/), `version.mk` (`NVIDIA_VERSION = <version>`) and kernel-open/, where the .ko land.

The tarball is hostile input: members are regular files and directories below the one top
directory with canonical names, nothing else; its version is the top directory's and version.mk's,
and the two must agree.
"""

from __future__ import annotations

import os
import re
import tarfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlparse

from .. import download as dl
from ..errors import ArtifactError, InputError
from ..safetar import name_problem
from ..vocab import DRIVER_VERSION

PROJECT = "open-gpu-kernel-modules"
VERSION_RE = re.compile(r"^NVIDIA_VERSION\s*[:?]?=\s*(\S+)\s*$", re.M)
OUTPUT_DIR = "kernel-open"  # where `make modules` leaves the .ko files, relative to the top
# What `make modules` runs beyond kbuild's toolchain: xz (src/nvidia-modeset compresses its shaders)
# and a C++ compiler (its DisplayPort library is C++), besides the C compiler of the kernel.
BUILD_PACKAGES = ("xz-utils",)
MAX_VERSION_MK = 64 * 1024
MAX_MEMBERS = 100_000
MAX_BYTES = 2 << 30  # unpacked; a release is about 150 MB


def build_packages(c_compiler: str) -> tuple[str, ...]:
    """The packages a release's build needs beside the build root's recipe, whose C compiler is the
    package `c_compiler` ('gcc-12' -> its C++ compiler 'g++-12')."""
    return (*BUILD_PACKAGES, cxx_of(c_compiler))


def cxx_of(c_compiler: str) -> str:
    """The C++ compiler beside a gcc: 'gcc-12' -> 'g++-12', 'x86_64-linux-gnu-gcc-12' ->
    'x86_64-linux-gnu-g++-12' (a package or program name; the last 'gcc' is replaced)."""
    head, sep, tail = c_compiler.rpartition("gcc")
    if not sep:
        raise InputError(f"{c_compiler!r}: no gcc to take the C++ compiler of (open-source builds need gcc)")
    return f"{head}g++{tail}"


def release_name(url: str, flag: str = "--open-source") -> str:
    name = Path(unquote(urlparse(url).path)).name
    if not name:
        raise InputError(f"{flag}: {url!r} does not name a file")
    return name


def name_version(name: str, project: str = PROJECT) -> str | None:
    """The version a release's file name carries ('open-gpu-kernel-modules-580.142.tar.gz'), or None."""
    m = re.match(rf"^{re.escape(project)}-({DRIVER_VERSION})\.(?:tar(?:\.\w+)?|tgz)$", name)
    return m[1] if m else None


def fetch(url: str, sha256: str, cache: Path, *, progress: dl.Progress | None = None,
          flag: str = "--open-source") -> Path:
    """The release tarball at `url` (URL or path), downloaded into `cache` and checked against `sha256`."""
    dest = cache / "open-source" / sha256.lower() / release_name(url, flag)
    return dl.download(url, dest, sha256=sha256, progress=progress, insecure_http=True)


def _open(path: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(path, mode="r|*")
    except (tarfile.TarError, OSError, EOFError) as e:
        raise InputError(f"{path.name}: not a tar archive ({e})") from None


def _checked(path: Path, member: tarfile.TarInfo, top: str | None) -> tuple[str, PurePosixPath]:
    """(top directory, path below it) of `member`; refuses names and types a release cannot have."""
    name = member.name.rstrip("/") if member.isdir() else member.name
    problem = name_problem(name)
    if problem:
        raise ArtifactError(f"{path.name}: member {member.name!r}: {problem}")
    if not (member.isreg() or member.isdir()):
        raise ArtifactError(f"{path.name}: member {member.name!r} is not a file or directory (refused)")
    first, _, rest = name.partition("/")
    if top is not None and first != top:
        raise ArtifactError(f"{path.name}: member {member.name!r} is outside the top directory {top}/")
    return first, PurePosixPath(rest)


def _top_version(path: Path, top: str, project: str = PROJECT) -> str:
    m = re.fullmatch(rf"{re.escape(project)}-(?P<version>{DRIVER_VERSION})", top)
    if not m:
        raise InputError(
            f"{path.name}: top directory {top!r} is not {project}-<version> "
            f"(a `git archive` of an NVIDIA {project} tag)"
        )
    return m["version"]


def _check_version_mk(path: Path, text: str, version: str) -> None:
    m = VERSION_RE.search(text)
    if not m:
        raise InputError(f"{path.name}: version.mk names no NVIDIA_VERSION")
    if m[1] != version:
        raise InputError(
            f"{path.name}: version.mk says NVIDIA_VERSION {m[1]}, the top directory says {version}"
        )


def read_version(path: Path, project: str = PROJECT) -> str:
    """The driver version of the release at `path`: its top directory's, checked against version.mk.
    `project`: the top directory's name before `-<version>` (nvidia-persistenced's archives too)."""
    top: str | None = None
    version: str | None = None
    with _open(path) as tar:
        try:
            for member in tar:
                first, rest = _checked(path, member, top)
                if top is None:
                    top, version = first, _top_version(path, first, project)
                if str(rest) == "version.mk" and member.isreg():
                    if member.size > MAX_VERSION_MK:
                        raise InputError(f"{path.name}: version.mk is larger than {MAX_VERSION_MK} bytes")
                    data = tar.extractfile(member)
                    assert data is not None and version is not None  # version: set with top
                    _check_version_mk(path, data.read().decode("utf-8", "replace"), version)
                    return version
        except (tarfile.TarError, EOFError, OSError) as e:
            raise ArtifactError(f"{path.name}: damaged archive ({e})") from None
    raise InputError(f"{path.name}: no version.mk (not an NVIDIA {project} release)")


def extract_tree(path: Path, dest: Path, project: str = PROJECT,
                 needs: tuple[str, ...] = ("Makefile", f"{OUTPUT_DIR}/Kbuild")) -> Path:
    """Unpack the release's top directory as `dest` (a new directory); returns `dest`. `needs`: the
    files an archive of `project` has (else InputError).

    Regular files and directories only, each created afresh (O_EXCL, no links followed): nothing
    lands outside `dest` and no member replaces another."""
    top = extract_top_dir(path, dest, lambda p, first: _top_version(p, first, project))
    if top is None or not all((dest / n).is_file() for n in needs):
        raise InputError(f"{path.name}: no {' and '.join(needs)} (not an NVIDIA {project} release)")
    return dest


def extract_top_dir(path: Path, dest: Path, check_top: Callable[[Path, str], object]) -> str | None:
    """Unpack the one top directory of the source tarball `path` as `dest` (a new directory), by the
    rules above (regular files and directories only, created afresh, bounded); `check_top(path, top)`
    refuses a top directory of the wrong name. Returns the top directory's name (None: empty)."""
    dest.mkdir(parents=True)
    top: str | None = None
    count = size = 0
    with _open(path) as tar:
        try:
            for member in tar:
                first, rest = _checked(path, member, top)
                if top is None:
                    top = first
                    check_top(path, first)
                count += 1
                size += member.size
                if count > MAX_MEMBERS or size > MAX_BYTES:
                    raise ArtifactError(f"{path.name}: more than {MAX_MEMBERS} members or {MAX_BYTES} bytes")
                if not rest.parts:
                    continue
                target = dest.joinpath(*rest.parts)
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                mode = 0o755 if member.mode & 0o111 else 0o644
                try:
                    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
                except FileExistsError:
                    raise ArtifactError(f"{path.name}: member {member.name!r} appears twice") from None
                src = tar.extractfile(member)
                assert src is not None
                with os.fdopen(fd, "wb") as out:
                    while chunk := src.read(1 << 20):
                        out.write(chunk)
                os.chmod(target, mode)
        except (tarfile.TarError, EOFError) as e:
            raise ArtifactError(f"{path.name}: damaged archive ({e})") from None
    return top
