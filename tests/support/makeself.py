"""Build real makeself self-extracting archives (Debian's `makeself`) for the runfile tests."""

from __future__ import annotations

import os
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


# An NVIDIA installer's tree made from real files: a user space of Debian's packages laid out as
# NVIDIA's .run installers lay theirs out (files at the top, firmware/, supported-gpus/) with the
# `.manifest` nvidia-installer reads (NVIDIA/nvidia-installer's parse_manifest(): eight header lines,
# then `FILE MODE TYPE [ARCH] [PATH] [TARGET]` per file, the fields its manifest.c table gives each type).
MANIFEST_HEADER = (
    "NVIDIA Accelerated Graphics Driver for Linux-x86_64\n{version}\n1\n"
    "nvidia nvidia-modeset nvidia-drm nvidia-uvm nvidia-peermem\nnvidia-frontend\nnvidia-frontend.ko\n"
    "kernel\nprecompiled\n"
)
CUDA_LIBS = ("libcuda.so", "libnvidia-ptxjitcompiler.so", "libnvidia-nvvm.so", "libnvidia-pkcs11-openssl3.so")
UTILITY_LIBS = ("libnvidia-ml.so", "libnvidia-cfg.so")


def debian_userspace(cache: Path, version: str = "535.309.01") -> Path | None:
    """The real user-space artifact of `version` built from Debian's packages that the test cache
    holds (the slow tier's shared build publishes it), or None."""
    for p in (cache / "real-build" / "store", cache / "userspace"):
        found = p / f"nvidia-userspace-{version}-amd64.tar.zst"
        if found.is_file():
            return found
    return None


def nvidia_tree(payload: Path, dest: Path, version: str, *, manifest_version: str | None = None) -> Path:
    """The extracted user space `payload` (lib64/, bin/, firmware/, share/) as an NVIDIA installer's
    tree at `dest` with its `.manifest` (declaring `manifest_version`, default `version`)."""
    dest.mkdir(parents=True)
    lines = [MANIFEST_HEADER.format(version=manifest_version or version).rstrip("\n")]
    lines.append("nvidia-installer 0755 INSTALLER_BINARY")
    lines.append("kernel/nvidia/nv.c 0644 KERNEL_MODULE_SRC INHERIT_PATH_DEPTH:1")  # not shipped here
    for lib in sorted((payload / "lib64").iterdir()):
        if lib.is_symlink():
            continue
        shutil.copyfile(lib, dest / lib.name)
        base = lib.name.rsplit(f".{version}", 1)[0]
        kind = "CUDA" if base in CUDA_LIBS else "UTILITY_LIB"
        lines.append(f"{lib.name} 0755 CUDA_LIB NATIVE /" if kind == "CUDA"
                     else f"{lib.name} 0755 UTILITY_LIB NATIVE")
        for link in sorted((payload / "lib64").iterdir()):
            if link.is_symlink() and os.readlink(link) == lib.name:
                lines.append(f"{link.name} 0755 CUDA_SYMLINK NATIVE / {lib.name}" if kind == "CUDA"
                             else f"{link.name} 0755 UTILITY_LIB_SYMLINK NATIVE {lib.name}")
        # the development link (the installer makes it too): never part of the user space
        lines.append(f"{base} 0755 CUDA_SYMLINK NATIVE / {base}.1" if kind == "CUDA"
                     else f"{base} 0755 UTILITY_LIB_SYMLINK NATIVE {base}.1")
    for tool in sorted((payload / "bin").iterdir()):
        shutil.copyfile(tool, dest / tool.name)
        os.chmod(dest / tool.name, 0o755)
        lines.append(f"{tool.name} 4755 NVIDIA_MODPROBE /usr/bin" if tool.name == "nvidia-modprobe"
                     else f"{tool.name} 0755 UTILITY_BINARY")
    (dest / "firmware").mkdir()
    for fw in sorted((payload / "firmware" / "nvidia" / version).iterdir()):
        shutil.copyfile(fw, dest / "firmware" / fw.name)
        lines.append(f"firmware/{fw.name} 0444 FIRMWARE INHERIT_PATH_DEPTH:1")
    if (payload / "share" / "supported-gpus.json").is_file():
        (dest / "supported-gpus").mkdir()
        gpus = "supported-gpus/supported-gpus.json"
        shutil.copyfile(payload / "share" / "supported-gpus.json", dest / gpus)
        lines.append(f"{gpus} 0644 DOCUMENTATION share/doc/NVIDIA_GLX-1.0/supported-gpus")
    (dest / "README.txt").write_text("NVIDIA driver README\n")
    lines.append("README.txt 0644 DOCUMENTATION share/doc/NVIDIA_GLX-1.0")
    (dest / ".manifest").write_text("\n".join(lines) + "\n")
    return dest
