"""The user-space artifact made from an NVIDIA `.run` installer's own files, laid out exactly like
the one made from Debian's packages (nodeprep.builder.userspace), so install, the CDI spec, doctor
and the kernel hooks take either:

    .manifest (sources.runfile.read_manifest) -> plan_layout (pure: which of its entries are the
    libraries, their soname links, the tools, the firmware, the supported-GPU list) -> only those
    files extracted -> payload -> SONAMEs checked -> pack (same kind, same input-digest parameters).

The libraries are the compute ones Debian's packages of userspace.ROLES ship (the installer also
carries OpenGL, Vulkan, video and X libraries a compute node does not load); the soname links are
the ones the manifest declares, each checked against its library's own SONAME.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from .. import sonames
from ..artifact import Manifest, input_digest
from ..digests import sha256_file
from ..errors import ArtifactError, InputError
from ..sources import runfile
from . import fabricmanager as fm
from . import userspace
from .userspace import BINARIES, SONAME_LINK_RE, TRIPLETS, check_required, digest_params, is_elf, place

log = logging.getLogger(__name__)

# the libraries of the packages of userspace.ROLES: the same lib64/ as a Debian-built user space
LIBRARIES = (
    "libcuda.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-cfg.so",
    "libnvidia-pkcs11-openssl3.so",
)
LIBRARY_TYPES = ("CUDA_LIB", "UTILITY_LIB")
LINK_TYPES = ("CUDA_SYMLINK", "UTILITY_LIB_SYMLINK")
BINARY_TYPES = ("UTILITY_BINARY", "NVIDIA_MODPROBE")
SUPPORTED_GPUS = "supported-gpus.json"


@dataclass(frozen=True)
class Placement:
    """One payload path: a file copied from the installer (`src`) or a soname link (`target`)."""

    dest: str
    src: str = ""
    mode: int = 0o644
    target: str = ""
    elf: bool = False  # must be an ELF object (libraries, tools)


def plan_layout(manifest: runfile.RunManifest, driver_version: str, arch: str, *,
                source: str = ".manifest") -> tuple[Placement, ...]:
    """The payload of the user space from the installer's `.manifest` (pure). InputError when the
    manifest is of another driver version or lacks what every user space needs."""
    if arch not in TRIPLETS:
        raise InputError(f"arch {arch!r}: unsupported (known: {', '.join(TRIPLETS)})")
    if manifest.version != driver_version:
        raise InputError(f"{source}: .manifest is driver {manifest.version}, not {driver_version}: the "
                         "kernel modules and the user space must be the same version")
    out: dict[str, Placement] = {}
    wanted = {f"{base}.{driver_version}" for base in LIBRARIES}
    native = [e for e in manifest.entries if e.arch in ("", "NATIVE")]
    for e in native:
        if e.type in LIBRARY_TYPES and e.name in wanted:
            if f"lib64/{e.name}" in out:
                raise InputError(f"{source}: {e.name} is listed twice")
            out[f"lib64/{e.name}"] = Placement(f"lib64/{e.name}", e.file, 0o755, elf=True)
    libraries = {PurePosixPath(d).name for d in out}
    for e in native:
        if e.type in LINK_TYPES and SONAME_LINK_RE.match(e.name) and e.target in libraries:
            out.setdefault(f"lib64/{e.name}", Placement(f"lib64/{e.name}", target=e.target))
    binaries = []
    for e in manifest.entries:
        if e.type in BINARY_TYPES and e.name in BINARIES and f"bin/{e.name}" not in out:
            # nvidia-modprobe is setuid in the installer: not in ours
            out[f"bin/{e.name}"] = Placement(f"bin/{e.name}", e.file, 0o755, elf=True)
            binaries.append(e.name)
        elif e.type == "FIRMWARE":
            dest = PurePosixPath("firmware", "nvidia", driver_version, e.path, e.name).as_posix()
            out.setdefault(dest, Placement(dest, e.file, 0o644))
        elif e.type == "DOCUMENTATION" and e.name == SUPPORTED_GPUS:
            out.setdefault(f"share/{SUPPORTED_GPUS}", Placement(f"share/{SUPPORTED_GPUS}", e.file, 0o644))
    try:
        check_required(libraries, binaries, driver_version, source)
    except ArtifactError as e:
        raise InputError(str(e)) from None
    return tuple(sorted(out.values(), key=lambda p: p.dest))


def layout_payload(tree: Path, payload: Path, placements: tuple[Placement, ...], *,
                   source: str = "runfile") -> dict[str, list[str]]:
    """Place the extracted files of `tree` and the soname links in `payload`; returns the relative
    paths per top-level directory (as userspace.layout_payload). ArtifactError when a file is not
    what the manifest says it is (a library or tool that is no ELF object, a link whose name is not
    its library's SONAME)."""
    out: dict[str, list[str]] = {"lib64": [], "bin": [], "firmware": [], "share": []}
    for p in placements:
        dest = payload / p.dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        top, _, rest = p.dest.partition("/")
        out[top].append(rest)
        if p.target:
            dest.symlink_to(p.target)
            continue
        src = tree / p.src
        if src.is_symlink() or not src.is_file():
            raise ArtifactError(f"{source}: {p.src} is not a regular file in the installer")
        if p.elf and not is_elf(src):
            raise ArtifactError(f"{source}: {p.src} is not an ELF object")
        place(src, dest, p.mode)
    problems = sonames.tree_problems(payload, source)
    if problems:
        raise ArtifactError(problems[0])
    for p in placements:
        if p.target:
            fd = os.open(payload / "lib64" / p.target, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                name = sonames.read(f"{source}: {p.target}", fd)
            finally:
                os.close(fd)
            link = PurePosixPath(p.dest).name
            if name != link:
                raise ArtifactError(f"{source}: .manifest links {link} -> {p.target}, whose SONAME is {name}")
    return out


def build_userspace(run: Path, driver_version: str, dest_dir: Path, *, arch: str = "amd64",
                    os_name: str, fabricmanager: Any = None) -> tuple[Path, Manifest]:
    """Build (or reuse) `nvidia-userspace-<driver>-<arch>.tar.zst` in `dest_dir` from the installer
    `run`. Same installer -> same input digest -> no rebuild. `fabricmanager`: Fabric Manager of the
    driver's version (builder.fabricmanager.FabricManager), added."""
    inputs = {run.name: sha256_file(run)}
    if fabricmanager is not None:
        inputs[fabricmanager.name] = fabricmanager.sha256
    digest = input_digest(inputs, digest_params(driver_version, arch, None,
                                                fabricmanager.version if fabricmanager is not None else None))
    if (done := userspace.up_to_date(dest_dir, driver_version, arch, digest)) is not None:
        return done
    placements = plan_layout(runfile.read_manifest(run), driver_version, arch, source=run.name)
    with tempfile.TemporaryDirectory(prefix="nodeprep-userspace-") as tmp:
        tree, payload = Path(tmp) / "tree", Path(tmp) / "payload"
        runfile.extract_files(run, sorted({p.src for p in placements if p.src}), tree)
        contents = layout_payload(tree, payload, placements, source=run.name)
        extra: dict[str, object] = {"source": {"kind": "runfile", "name": run.name}}
        if "nvidia-persistenced" in contents["bin"]:  # the installer's own: the driver's version
            extra["persistenced"] = {"version": driver_version, "from": "runfile"}
        if fabricmanager is not None:
            fm.place(fabricmanager, payload, contents)
            extra["fabricmanager"] = fabricmanager.record()
        return userspace.pack_userspace(payload, dest_dir, driver_version, arch, os_name, digest, inputs,
                                        contents, extra)
