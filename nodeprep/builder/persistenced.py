"""nvidia-persistenced built from NVIDIA's source at the driver's exact version, for the user space.

Debian packages nvidia-persistenced apart from the driver, at its own version (bookworm: 535.171.04
beside driver 535.309.01). NVIDIA publishes its source (MIT) tagged at every driver version; a
`git archive` of the tag holds `nvidia-persistenced-<version>/` with `version.mk`.

    the archive (pinned sha256) -> its version, which must be the driver's exactly
    -> the build root + a cached layer with the target's tools_packages (libtirpc-dev, m4)
    -> a private clone -> plain `make` in it (chroot) -> the binary, its embedded version checked
    -> kept under <cache>/persistenced-builds/<build key> (same archive + same root: no rebuild)

The result replaces bin/nvidia-persistenced of the user-space artifact (nodeprep.builder.userspace).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import runner
from ..digests import canonical_json, sha256_bytes, sha256_file
from ..errors import BuildError, CommandError, InputError
from ..sources import opensource
from ..targets import TargetOS
from . import buildroot

log = logging.getLogger(__name__)

PROJECT = "nvidia-persistenced"
FORMAT = 1  # bump when the build procedure below changes its output
BUILD_DIR = "/build/nvidia-persistenced"
OUTPUT = "_out"
MAKE_TIMEOUT = 900
# version.mk's NVIDIA_VERSION, compiled into the line `--version` prints (a string of its own)
VERSION_STRING_RE = re.compile(rb"\x00nvidia-persistenced:\s+version (\d+\.\d+(?:\.\d+)?)\x00")
DEP_NAME_RE = re.compile(r"^\s*([a-z0-9][a-z0-9+.-]*)")


@dataclass(frozen=True)
class Built:
    """One nvidia-persistenced built from source (or found built by its build key)."""

    binary: Path
    version: str
    source: str  # the archive's file name
    sha256: str  # the archive's
    build_root: str  # the build root's key
    packages: tuple[str, ...]  # the layered root's packages ("name:arch=version")

    def params(self) -> dict[str, Any]:
        """What the user-space artifact's input digest takes from this build (beside the archive)."""
        return {"format": FORMAT, "version": self.version, "build_root": self.build_root,
                "packages_sha256": sha256_bytes("\n".join(self.packages).encode())}

    def record(self) -> dict[str, Any]:
        """The user-space manifest's `persistenced` record."""
        return {"version": self.version, "from": "source", "source": self.source, "sha256": self.sha256,
                **self.params()}


def check_version(source_version: str, driver_version: str, name: str) -> None:
    """InputError unless the source is of the driver's exact version."""
    if source_version != driver_version:
        raise InputError(f"--persistenced-source: {name} is nvidia-persistenced {source_version}, the driver "
                         f"is {driver_version}: persistenced must be the driver's exact version")


def source_version(path: Path) -> str:
    """The version of the archive at `path` (its top directory's, checked against version.mk)."""
    return opensource.read_version(path, PROJECT)


def embedded_version(data: bytes) -> str | None:
    """The driver version compiled into an nvidia-persistenced binary (the `--version` line's), None
    when there is none or more than one."""
    found = {m[1].decode() for m in VERSION_STRING_RE.finditer(data)}
    return found.pop() if len(found) == 1 else None


def _dep_names(depends: str) -> list[list[str]]:
    """Debian Depends text -> alternatives' package names per clause."""
    out = []
    for clause in depends.split(","):
        names = [m[1] for alt in clause.split("|") if (m := DEP_NAME_RE.match(alt))]
        if names:
            out.append(names)
    return out


def tools_layer(build_root: buildroot.BuildRoot, archive: Any, target: TargetOS, cache: Path,
                arch: str = "amd64") -> buildroot.BuildRoot:
    """`build_root` plus the target's tools_packages it lacks, unpacked from the archive's .debs as a cached
    layer (buildroot.with_debs). Every Depends of those packages must be in the root already (they
    are small leaf packages: m4 needs libc6, libtirpc-dev its libtirpc3); InputError names one
    that is not."""
    have = {p.split(":", 1)[0].split("=", 1)[0] for p in build_root.packages}
    wanted = [p for p in target.tools_packages if p not in have]
    if not wanted:
        return build_root
    chosen: list[tuple[str, str]] = []
    for pkg in wanted:
        versions = archive.versions(pkg)
        if not versions:
            raise InputError(f"{target.name}: the archive serves no {pkg} (needed to build {PROJECT})")
        chosen.append((pkg, versions[0]))
    for pkg, version in chosen:
        for names in _dep_names(archive.info(pkg, version).get("Depends", "")):
            if not any(n in have or n in wanted for n in names):
                raise InputError(f"{pkg}={version} needs {' or '.join(names)}, which the {target.name} "
                                 "build root lacks: add it to the target's build root packages")
    debs = archive.download_many(chosen)
    return buildroot.with_debs(build_root, [Path(d) for d in debs], cache, "tools",
                               packages=tuple(f"{p}:{arch}={v}" for p, v in chosen))


def make_argv(compiler: str, jobs: int) -> list[str]:
    """Plain make of the source tree in the build root: libtirpc named directly (no pkg-config),
    the id string's date and user fixed."""
    return ["make", "-C", BUILD_DIR, f"-j{jobs}", f"OUTPUTDIR={OUTPUT}", f"CC={compiler}", "USE_TIRPC=1",
            "TIRPC_CFLAGS=-I/usr/include/tirpc", "TIRPC_LDFLAGS=-ltirpc", "DATE=date -u -d @0",
            "WHOAMI=echo nodeprep", "NV_VERBOSE=1"]


def build_key(sha256: str, build_root: buildroot.BuildRoot, compiler: str) -> str:
    return sha256_bytes(canonical_json({"format": FORMAT, "source": sha256,
                                        "build_root": list(build_root.packages), "compiler": compiler}))


def build(source: Path, sha256: str, driver_version: str, build_root: buildroot.BuildRoot, archive: Any,
          target: TargetOS, cache: Path, *, arch: str = "amd64", jobs: int | None = None,
          rebuild: bool = False) -> Built:
    """nvidia-persistenced of the archive `source` (sha256 `sha256`, already checked) for
    `driver_version`, built in `build_root` with the target's tools layered over it."""
    version = source_version(source)
    check_version(version, driver_version, source.name)
    layered = tools_layer(build_root, archive, target, cache, arch)
    compiler = target.compiler
    key = build_key(sha256, layered, compiler)
    kept = cache / "persistenced-builds" / key
    record = kept / "build.json"
    if not rebuild and record.is_file() and (kept / PROJECT).is_file():
        log.info("%s %s: built earlier from the same source and build root (%s…)", PROJECT, version, key[:12])
        return _built(kept / PROJECT, version, source.name, sha256, layered)
    log_path = cache / "logs" / f"{PROJECT}-{version}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with buildroot.workspace(layered, cache / "tmp") as clone:
        tree = clone / BUILD_DIR.lstrip("/")
        tree.parent.mkdir(parents=True, exist_ok=True)
        opensource.extract_tree(source, tree, PROJECT, needs=("Makefile", "version.mk"))
        try:
            runner.run(make_argv(compiler, jobs or os.cpu_count() or 1), root=clone,
                       env={"HOME": "/root", "SOURCE_DATE_EPOCH": "0", "LC_ALL": "C"},
                       timeout=MAKE_TIMEOUT, log_path=log_path)
        except CommandError as e:
            raise BuildError(f"building {PROJECT} {version} failed (make exit {e.returncode}); full log: "
                             f"{log_path}", hint=e.tail) from None
        binary = tree / OUTPUT / PROJECT
        if not binary.is_file():
            raise BuildError(f"building {PROJECT} {version}: make made no {OUTPUT}/{PROJECT}; log: "
                             f"{log_path}")
        found = embedded_version(binary.read_bytes())
        if found != version:
            raise BuildError(f"{PROJECT} built from {source.name} says version {found}, not {version}")
        staging = buildroot.private_dir(cache / "tmp", "persistenced")
        try:
            shutil.copyfile(binary, staging / PROJECT)
            os.chmod(staging / PROJECT, 0o755)
            (staging / "build.json").write_text(json.dumps({"version": version, "source": source.name,
                                                            "sha256": sha256}, sort_keys=True))
            kept.parent.mkdir(parents=True, exist_ok=True)
            if kept.exists():
                shutil.rmtree(kept)
            os.replace(staging, kept)
        finally:
            buildroot.remove_tree(staging)
    log.info("%s %s built from %s (binary sha256 %s…)", PROJECT, version, source.name,
             sha256_file(kept / PROJECT)[:12])
    return _built(kept / PROJECT, version, source.name, sha256, layered)


def _built(binary: Path, version: str, name: str, sha256: str, build_root: buildroot.BuildRoot) -> Built:
    return Built(binary=binary, version=version, source=name, sha256=sha256, build_root=build_root.recipe.key,
                 packages=build_root.packages)
