"""NVIDIA Fabric Manager at the driver's exact version, from NVIDIA's redistributable archive.

NVIDIA publishes no source for it; its redist archive `fabricmanager-linux-<arch>-<version>-archive.tar.xz`
(pinned by sha256 like `--runfile`) holds one top directory of that name without `.tar.xz`:

    bin/nv-fabricmanager, bin/nvswitch-audit, bin/nvidia-fabricmanager-start.sh
    lib/libnvfm.so.1 (+ the libnvfm.so development link)
    etc/fabricmanager.cfg, etc/fabricmanager_multinode.cfg
    share/nvidia/nvswitch/<board>_topology
    systemd/nvidia-fabricmanager.service, include/nv_fm_agent.h, nv_fm_types.h, LICENSE

Its version (the file name's and the top directory's, which must agree) must be the driver's exactly:
Fabric Manager refuses to start beside another driver version (gpu-operator #544, #121). What a node
runs goes into the user-space artifact:

    bin/nv-fabricmanager, bin/nvswitch-audit, lib64/libnvfm.so.1,
    share/nvidia/nvswitch/<topologies>, share/nvidia/nvswitch/fabricmanager.cfg

the configuration with its paths into /usr/share/nvidia/nvswitch pointed at the active root's copy
(/opt/nvidia/current/share/nvidia/nvswitch). The archive is hostile input: regular files below the one
top directory with canonical names (links are skipped, anything else refused), each read bounded;
the programs and the library must be ELF objects, the library's SONAME libnvfm.so.1.
"""

from __future__ import annotations

import os
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote, urlparse

from .. import download as dl
from .. import elf, sonames
from ..errors import ArtifactError, InputError
from ..safetar import name_problem
from ..vocab import DRIVER_VERSION

ARCHES = {"amd64": "x86_64", "arm64": "sbsa"}
NAME_RE = re.compile(rf"^fabricmanager-linux-(?P<arch>x86_64|sbsa)-(?P<version>{DRIVER_VERSION})-archive"
                     r"\.tar\.xz$")
PROGRAMS = ("nv-fabricmanager", "nvswitch-audit")
LIBRARY = "libnvfm.so.1"
CONFIG = "fabricmanager.cfg"
SHARE = "share/nvidia/nvswitch"
NODE_SHARE = f"/opt/nvidia/current/{SHARE}"
PACKAGED_SHARE = "/usr/share/nvidia/nvswitch"
MAX_FILE = 256 << 20
MAX_MEMBERS = 10_000


@dataclass(frozen=True)
class FabricManager:
    """What a node needs of one archive: payload path -> (bytes, mode)."""

    version: str
    name: str  # the archive's file name
    sha256: str
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """The user-space manifest's `fabricmanager` record."""
        return {"version": self.version, "source": self.name, "sha256": self.sha256,
                "files": sorted(self.files)}


def archive_name(url: str) -> str:
    name = Path(unquote(urlparse(url).path)).name
    if not name:
        raise InputError(f"--fabricmanager: {url!r} does not name a file")
    return name


def name_version(name: str) -> tuple[str, str] | None:
    """(arch, version) a `fabricmanager-linux-<arch>-<version>-archive.tar.xz` name carries, or None."""
    m = NAME_RE.match(name)
    return (m["arch"], m["version"]) if m else None


def check_version(version: str, driver_version: str, name: str) -> None:
    """InputError (one line naming both) unless the archive is the driver's exact version."""
    if version != driver_version:
        raise InputError(f"--fabricmanager: {name} is Fabric Manager {version}, the driver is "
                         f"{driver_version}: Fabric Manager must be the driver's exact version")


def check_name(name: str, driver_version: str | None, arch: str) -> str:
    """The version the archive's name carries, checked against the driver's (when known) and the arch."""
    found = name_version(name)
    if found is None:
        raise InputError(f"--fabricmanager: {name!r} is not named fabricmanager-linux-<arch>-<version>-"
                         "archive.tar.xz (NVIDIA's redistributable archive)")
    farch, version = found
    if ARCHES.get(arch) != farch:
        raise InputError(f"--fabricmanager: {name} is for {farch}, the build is for {arch}")
    if driver_version is not None:
        check_version(version, driver_version, name)
    return version


def fetch(url: str, sha256: str, cache: Path, *, progress: dl.Progress | None = None) -> Path:
    """The archive at `url` (URL or path), in the cache, checked against `sha256`."""
    dest = cache / "fabricmanager" / sha256.lower() / archive_name(url)
    return dl.download(url, dest, sha256=sha256, progress=progress, insecure_http=True)


def node_config(text: str) -> str:
    """NVIDIA's fabricmanager.cfg with every value naming the packaged share folder pointed at the
    active root's (TOPOLOGY_FILE_PATH, DATABASE_PATH where it is there); nothing else changes."""
    out = []
    for line in text.splitlines(keepends=True):
        key, eq, value = line.partition("=")
        if eq and not key.lstrip().startswith("#") and value.strip().rstrip("/") == PACKAGED_SHARE:
            line = f"{key}={NODE_SHARE}\n"
        out.append(line)
    return "".join(out)


def _wanted(rest: PurePosixPath) -> str | None:
    """The payload path of an archive member (its path below the top directory), None: not taken."""
    parts = rest.parts
    if len(parts) == 2 and parts[0] == "bin" and parts[1] in PROGRAMS:
        return f"bin/{parts[1]}"
    if parts == ("lib", LIBRARY):
        return f"lib64/{LIBRARY}"
    if parts == ("etc", CONFIG):
        return f"{SHARE}/{CONFIG}"
    if len(parts) == 4 and parts[:3] == ("share", "nvidia", "nvswitch") and parts[3].endswith("_topology"):
        return f"{SHARE}/{parts[3]}"
    return None


def read_archive(path: Path, sha256: str, driver_version: str, arch: str) -> FabricManager:
    """The files a node needs from the archive at `path`, after its name, top directory and members
    were checked (InputError/ArtifactError, one line)."""
    version = check_name(path.name, driver_version, arch)
    top = path.name.removesuffix(".tar.xz")
    files: dict[str, tuple[bytes, int]] = {}
    try:
        tar = tarfile.open(path, mode="r|xz")
    except (tarfile.TarError, OSError, EOFError) as e:
        raise InputError(f"{path.name}: not an xz-compressed tar archive ({e})") from None
    with tar:
        try:
            for count, member in enumerate(tar):
                if count > MAX_MEMBERS:
                    raise ArtifactError(f"{path.name}: more than {MAX_MEMBERS} members")
                name = member.name.rstrip("/") if member.isdir() else member.name
                problem = name_problem(name)
                if problem:
                    raise ArtifactError(f"{path.name}: member {member.name!r}: {problem}")
                first, _, rest = name.partition("/")
                if first != top:
                    raise ArtifactError(f"{path.name}: member {member.name!r} is outside the top directory "
                                        f"{top}/ (its version must be the file name's)")
                if member.isdir() or member.issym():
                    continue  # links are never taken: the node's soname links are made from SONAMEs
                if not member.isreg():
                    raise ArtifactError(f"{path.name}: member {member.name!r} is not a file, directory or "
                                        "symbolic link (refused)")
                dest = _wanted(PurePosixPath(rest))
                if dest is None:
                    continue
                if member.size > MAX_FILE:
                    raise ArtifactError(f"{path.name}: {member.name} is larger than {MAX_FILE} bytes")
                if dest in files:
                    raise ArtifactError(f"{path.name}: {member.name} appears twice")
                data = tar.extractfile(member)
                assert data is not None
                files[dest] = (data.read(), 0o755 if dest.startswith("bin/") else 0o644)
        except (tarfile.TarError, EOFError, OSError) as e:
            raise ArtifactError(f"{path.name}: damaged archive ({e})") from None
    _check_files(path.name, files)
    config = files[f"{SHARE}/{CONFIG}"]
    files[f"{SHARE}/{CONFIG}"] = (node_config(config[0].decode("utf-8", "replace")).encode(), config[1])
    return FabricManager(version=version, name=path.name, sha256=sha256, files=files)


def _check_files(name: str, files: dict[str, tuple[bytes, int]]) -> None:
    needs = {**{f"bin/{p}": f"bin/{p}" for p in PROGRAMS}, f"lib64/{LIBRARY}": f"lib/{LIBRARY}",
             f"{SHARE}/{CONFIG}": f"etc/{CONFIG}"}
    for dest, member in needs.items():
        if dest not in files:
            raise InputError(f"{name}: no {member} in the archive (not NVIDIA's fabricmanager archive)")
    for dest, (data, _) in files.items():
        if (dest.startswith("bin/") or dest.startswith("lib64/")) and not data.startswith(b"\x7fELF"):
            raise ArtifactError(f"{name}: {dest.split('/', 1)[1]} is not an ELF object")
    lib = files[f"lib64/{LIBRARY}"][0]
    try:
        soname = elf.soname(lambda offset, length: lib[offset:offset + length], len(lib),
                            byteorder=sonames.BYTEORDER)
    except elf.ElfError as e:
        raise ArtifactError(f"{name}: {LIBRARY}: {e}") from None
    if soname != LIBRARY:
        raise ArtifactError(f"{name}: {LIBRARY} has SONAME {soname}, not {LIBRARY}")
    if not any(d.endswith("_topology") for d in files):
        raise InputError(f"{name}: no share/nvidia/nvswitch/*_topology (not NVIDIA's fabricmanager archive)")


def place(fm: FabricManager, payload: Path, contents: dict[str, list[str]]) -> None:
    """Write the archive's files into the user-space `payload` (new files only) and list them in
    `contents` (per top-level directory, as userspace.layout_payload does)."""
    for dest, (data, mode) in sorted(fm.files.items()):
        target = payload / dest
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(target, mode)
        top, _, rest = dest.partition("/")
        contents.setdefault(top, []).append(rest)
