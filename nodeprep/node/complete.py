"""Proof that a driver root is complete, before nodeprep installs it or switches `current` to it.

Complete means: the files every user space must hold (nodeprep.build.userspace.REQUIRED_LIBRARIES
and REQUIRED_BINARIES) are regular files, and an ld cache built by `ldconfig` from that root's
lib64 alone (a staged cache and configuration in a temporary directory, `-X`: no links touched)
resolves each required soname (libcuda.so.1, libnvidia-ml.so.1) to a file inside it. An incomplete
root is refused with ArtifactError (exit 2) naming what is missing.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from .. import runner
from ..build.userspace import REQUIRED_BINARIES, REQUIRED_LIBRARIES
from ..errors import ArtifactError, CommandError
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


def problems(layout: Layout, vdir: Path, version: str) -> list[str]:
    """What makes the driver root `vdir` (a directory under layout.opt) incomplete; empty: nothing."""
    found = [f"{rel} is missing" for rel in required_files(version) if not _regular(vdir / rel)]
    lib64 = vdir / "lib64"
    resolved = staged_ld_cache(layout, lib64) if lib64.is_dir() else {}
    real_lib64 = os.path.realpath(lib64)
    for soname in REQUIRED_LIBRARIES.values():
        if not any(os.path.dirname(t) == real_lib64 and _regular(Path(t)) for t in resolved.get(soname, [])):
            found.append(f"the ld cache does not resolve {soname} into {layout.node_path(lib64)}")
    return found


def staged_ld_cache(layout: Layout, lib64: Path) -> dict[str, list[str]]:
    """soname -> real host paths of the files it resolves to, from an ld cache that `ldconfig` builds
    for `lib64` alone, in a temporary directory under layout.opt (inside --root via `-r`)."""
    tmp = layout.opt / f".tmp-ldcheck-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        conf, cache = tmp / "ld.so.conf", tmp / "ld.so.cache"
        conf.write_text(layout.node_path(lib64) + "\n")
        argv: list[str | Path] = ["ldconfig", "-X", "-C", layout.node_path(cache),
                                  "-f", layout.node_path(conf)]
        if not layout.live:
            argv += ["-r", layout.root]
        try:
            runner.run(argv, timeout=120)
            out = runner.run(["ldconfig", "-p", "-C", cache], timeout=60).stdout if cache.exists() else ""
        except CommandError as e:
            raise ArtifactError(f"{layout.node_path(lib64)}: ldconfig cannot build a cache for it "
                                f"({e})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    found: dict[str, list[str]] = {}
    for line in out.splitlines()[1:]:
        if " => " not in line:
            continue
        left, path = line.strip().rsplit(" => ", 1)
        soname = left.split(" (", 1)[0].strip()
        found.setdefault(soname, []).append(os.path.realpath(layout.host_path(path.strip())))
    return found


def check(layout: Layout, vdir: Path, version: str, *, action: str) -> None:
    """Raise ArtifactError (one line) when the driver root `vdir` is incomplete."""
    found = problems(layout, vdir, version)
    if found:
        raise ArtifactError(f"driver {version}: incomplete user space, refusing to {action} it: "
                            + "; ".join(found))
