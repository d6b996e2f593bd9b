"""Proof that a driver root is complete, before nodeprep installs it or switches `current` to it.

Complete means: the files every user space must hold (nodeprep.artifact.REQUIRED_LIBRARIES
and REQUIRED_BINARIES) are regular files, and an ld cache built by `ldconfig` from that root's
lib64 alone (staged in a private temporary tree, see staged_ld_cache) resolves each required
soname (libcuda.so.1, libnvidia-ml.so.1) to a file of it, and no ELF file of the root has a
SONAME other than a plain file name (nodeprep.sonames: ldconfig would link it outside lib64). An incomplete
root is refused with ArtifactError (exit 2) naming what is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

from .. import runner, sonames
from ..artifact import REQUIRED_BINARIES, REQUIRED_LIBRARIES
from ..errors import ArtifactError, CommandError
from . import imagefile
from .layout import Layout


def required_files(version: str) -> list[str]:
    """Paths relative to a version directory that must be regular files."""
    libs = [f"lib64/{base}.{version}" for base in REQUIRED_LIBRARIES]
    return libs + [f"bin/{b}" for b in REQUIRED_BINARIES]


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False


def fabricmanager_problem(vdir: Path, version: str) -> str | None:
    """Why the Fabric Manager of the driver root `vdir` must not run beside driver `version`: its
    recorded version (the user-space manifest's `fabricmanager` record) is another, or a root that
    ships bin/nv-fabricmanager records none. None when it has none, or the driver's."""
    try:
        raw = imagefile.read(vdir / "manifest.json", limit=16 << 20, what="driver manifest")
        data = json.loads(raw or b"{}")
    except ValueError:
        data = {}
    extra = data.get("extra") if isinstance(data, dict) else None
    rec = extra.get("fabricmanager") if isinstance(extra, dict) else None
    found = rec.get("version") if isinstance(rec, dict) else None
    if found is None:
        shipped = os.path.lexists(vdir / "bin/nv-fabricmanager")
        return "bin/nv-fabricmanager has no recorded version" if shipped else None
    if found != version:
        return f"its Fabric Manager is {found}, the driver is {version} (it must be the driver's version)"
    return None


def problems(layout: Layout, vdir: Path, version: str) -> list[str]:
    """What makes the driver root `vdir` (a directory under layout.opt) incomplete; empty: nothing."""
    found = [f"{rel} is missing" for rel in required_files(version) if not _regular(vdir / rel)]
    if fm := fabricmanager_problem(vdir, version):
        found.append(fm)
    lib64 = vdir / "lib64"
    unsafe = sonames.tree_problems(vdir, layout.node_path(vdir))  # lib64's links may lead anywhere in it
    if unsafe:  # ldconfig, here or when activated, would make links where the SONAME says
        return found + unsafe
    resolved = staged_ld_cache(layout, lib64) if lib64.is_dir() and not lib64.is_symlink() else {}
    for soname in REQUIRED_LIBRARIES.values():
        if not any(_regular(Path(t)) for t in resolved.get(soname, [])):
            found.append(f"the ld cache does not resolve {soname} into {layout.node_path(lib64)}")
    return found


def staged_ld_cache(layout: Layout, lib64: Path) -> dict[str, list[str]]:
    """soname -> the files of `lib64` it resolves to, in an ld cache that `ldconfig` builds for
    `lib64` alone. It runs chrooted (`-r`) in a private temporary tree under layout.opt that holds
    hard links to lib64's files and copies of its links, so nothing of the root changes (not even
    ldconfig's aux-cache) and nothing else on the root can satisfy a soname."""
    tmp = layout.opt / f".tmp-ldcheck-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    mirror = tmp / "nvidia" / "lib64"
    mirror.mkdir(parents=True)
    try:
        for entry in os.scandir(lib64):
            if entry.is_symlink():
                os.symlink(os.readlink(entry.path), mirror / entry.name)
            elif entry.is_file(follow_symlinks=False):
                try:
                    os.link(entry.path, mirror / entry.name)
                except OSError:
                    shutil.copyfile(entry.path, mirror / entry.name)
        (tmp / "etc").mkdir()
        (tmp / "etc" / "ld.so.conf").write_text("/nvidia/lib64\n")
        try:
            runner.run(["ldconfig", "-X", "-r", tmp, "-C", "/etc/ld.so.cache", "-f", "/etc/ld.so.conf"],
                       timeout=120)
            cache = tmp / "etc" / "ld.so.cache"
            out = runner.run(["ldconfig", "-p", "-C", cache], timeout=60).stdout if cache.exists() else ""
        except CommandError as e:
            raise ArtifactError(f"{layout.node_path(lib64)}: ldconfig cannot build a cache for it "
                                f"({e})") from None
        found: dict[str, list[str]] = {}
        real_mirror = os.path.realpath(mirror)
        for line in out.splitlines()[1:]:
            if " => " not in line:
                continue
            left, path = line.strip().rsplit(" => ", 1)
            real = os.path.realpath(tmp / path.strip().lstrip("/"))
            if os.path.dirname(real) == real_mirror and _regular(Path(real)):
                soname = left.split(" (", 1)[0].strip()
                found.setdefault(soname, []).append(str(lib64 / os.path.basename(real)))
        return found
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check(layout: Layout, vdir: Path, version: str, *, action: str) -> None:
    """Raise ArtifactError (one line) when the driver root `vdir` is incomplete."""
    found = problems(layout, vdir, version)
    if found:
        raise ArtifactError(f"driver {version}: incomplete user space, refusing to {action} it: "
                            + "; ".join(found))
