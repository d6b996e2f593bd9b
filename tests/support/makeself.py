"""Build real makeself self-extracting archives (Debian's `makeself`) for the runfile tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from nodeprep import runner


def need_makeself() -> None:
    if not runner.which("makeself"):
        pytest.fail("makeself is not installed (scripts/deps/build.apt lists it)")


def make_runfile(
    tree: Path,
    dest: Path,
    *,
    compression: str = "xz",
    label: str = "NVIDIA Accelerated Graphics Driver for Linux-x86_64 535.309.01",
    sha256: bool = True,
    level: int | None = None,
) -> Path:
    """Pack the directory `tree` like NVIDIA's installers are packed: a makeself archive whose
    startup script is ./nvidia-installer (a stub here: it must never run)."""
    need_makeself()
    installer = tree / "nvidia-installer"
    if not installer.exists():
        installer.write_text("#!/bin/sh\necho 'the installer must not be executed' >&2\nexit 99\n")
        installer.chmod(0o755)
    argv = ["makeself", f"--{compression}", "--nox11", "--tar-quietly"]
    if sha256:
        argv.append("--sha256")
    if level is not None:
        argv += ["--complevel", str(level)]
    res = runner.run([*argv, tree, dest, label, "./nvidia-installer"], check=False, timeout=600)
    if res.returncode != 0:
        raise RuntimeError(f"makeself failed: {res.stderr or res.stdout}")
    return dest


def copy_tree(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest, symlinks=True)
    return dest
