"""build-driver: NVIDIA kernel modules for one (driver, flavour, OS, kernel release) -> store.

The short orchestration of the pipeline; each step lives in its own module:

    resolve.py  validate the request, resolve and download the inputs -> ResolvedInputs, build_params
    (here)      build root (or the host's headers) -> input digest -> publish.store_hit? done.
    compile.py  sources into a build root clone -> kbuild -> strip (cached by compile key)
    publish.py  [sign] -> [smoke test] -> pack -> publish; then the user-space artifact

Same inputs give the same input digest and, on a hit, no compile at all.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..artifact import LocalStore, Manifest, artifact_name, input_digest, read_manifest
from ..digests import sha256_file
from ..log import timed
from ..progress import Phases, Sink
from . import buildroot, hostbuild
from .compile import compile_in_root
from .publish import (
    check_fabricmanager,
    check_persistenced,
    pack_and_publish,
    prebuild_userspace,
    publish_userspace,
    runfile_userspace,
    store_hit,
)
from .resolve import (
    AnyBuildRoot,
    BuildRequest,
    LazyArchive,
    ResolvedInputs,
    build_params,
    buildroot_extra,
    fetch_companions,
    open_archive,
    resolve_host_inputs,
    resolve_inputs,
    validate_request,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuildResult:
    """What build_driver made or found: the kmod artifact, its manifest, and how it got there."""

    artifact: Path
    manifest: Manifest
    cached: bool  # the store already had it: nothing was compiled
    compiled: bool  # the compiler ran in this invocation
    input_digest: str
    userspace: Path | None = None
    log_path: Path | None = None
    duration_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)  # seconds per step (not in the manifest)
    phases: dict[str, float] = field(default_factory=dict)  # seconds per progress.PHASES phase

    def published(self) -> list[str]:
        """The artifact file names this build published or found (kmod, then user space)."""
        return [self.artifact.name] + ([self.userspace.name] if self.userspace else [])

    def to_dict(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "artifact": str(self.artifact),
            "name": self.artifact.name,
            "sha256": sha256_file(self.artifact),
            "cached": self.cached,
            "compiled": self.compiled,
            "input_digest": self.input_digest,
            "driver_version": m.driver_version,
            "flavour": m.flavour,
            "kernel_release": m.kernel_release,
            "vermagic": m.vermagic,
            "os": m.os,
            "arch": m.arch,
            "compiler": m.compiler,
            "modules": sorted(p.rsplit("/", 1)[-1] for p in m.files),
            "userspace": str(self.userspace) if self.userspace else None,
            "log": str(self.log_path) if self.log_path else None,
            "smoke_test": m.extra.get("smoke_test", {}).get("verdict") if m.extra.get("smoke_test") else None,
            "signed": bool(m.extra.get("signing")),
            "duration_s": round(self.duration_s, 2),
            "timings": self.timings,
            "phases": self.phases,
            "notes": self.notes,
        }


def build_driver(req: BuildRequest, *, progress: Sink | None = None, archive: Any = None) -> BuildResult:
    """Build (or find in the store) the kmod artifact of `req`, then the user-space artifact.

    `progress` receives nodeprep.progress events (phases, objects compiled, bytes downloaded);
    the seconds per phase are in the result's `phases`."""
    start = time.monotonic()
    phases = Phases(progress)
    background: list[threading.Thread] = []
    try:
        return _build_driver(req, archive, phases, background, start)
    finally:
        for thread in background:
            thread.join()


def _resolve(
    req: BuildRequest, archive: Any, store: LocalStore, phases: Phases, background: list[threading.Thread]
) -> tuple[ResolvedInputs, Path | None, AnyBuildRoot]:
    """The resolved inputs, the source file (runfile or open-source release, if any) and the root to compile
    in (the host's, or the build root)."""
    if req.builder == "host":
        host_root, release = hostbuild.host_root(req.target, req.kernel, req.headers_dir)
        with phases.phase("resolve", "Resolving and downloading the inputs"):
            resolved, src_file = resolve_host_inputs(req, archive, release, phases)
            check_fabricmanager(req, resolved.driver_version)  # another version refused before the compile
        runfile_userspace(req, resolved.driver_version, phases)
        return resolved, src_file, host_root
    with phases.phase("resolve", "Resolving and downloading the inputs"):
        resolved, src_file = resolve_inputs(req, archive, phases)
        check_persistenced(req, resolved.driver_version)  # a wrong version refused before the build root
        check_fabricmanager(req, resolved.driver_version)  # so is Fabric Manager's
    runfile_userspace(req, resolved.driver_version, phases)
    recipe = buildroot.recipe_for(req.target, req.kernel, buildroot_extra(req))
    if not buildroot.cached(recipe, req.cache):
        # mmdebstrap is mostly one dpkg on one core: the user-space artifact is made meanwhile.
        prebuild_userspace(req, archive, store, resolved.driver_version, phases, background)
    with phases.phase("buildroot", f"Build root for {req.target.name}"):
        build_root = buildroot.ensure(
            recipe,
            req.cache,
            mirror=archive.mirror,
            security_mirror=getattr(archive, "security_mirror", None),
        )
    return resolved, src_file, build_root


def _userspace_last(
    req: BuildRequest,
    archive: Any,
    store: LocalStore,
    resolved: ResolvedInputs,
    notes: list[str],
    phases: Phases,
    background: list[threading.Thread],
    build_root: AnyBuildRoot | None = None,
) -> Path | None:
    """Wait for the user-space prebuild, then publish (or reuse) the user-space artifact."""
    for thread in background:
        thread.join()
    if not req.userspace:
        return None
    return publish_userspace(req, archive, store, resolved.driver_version, notes, phases, build_root)


def _build_driver(
    req: BuildRequest, archive: Any, phases: Phases, background: list[threading.Thread], start: float
) -> BuildResult:
    store = LocalStore(req.store)
    validate_request(req)
    archive = archive or (LazyArchive(req) if req.builder == "host" else open_archive(req))
    # The smoke test boots Debian's kernel: off by default for host builds for other OSes.
    smoke_on = req.smoke_test if req.smoke_test is not None else req.target.smoke_boot
    req = replace(req, smoke_test=smoke_on)

    buildroot.sweep_stale(req.cache / "tmp")
    resolved, src_file, build_root = _resolve(req, archive, store, phases, background)
    companion_files = fetch_companions(req, phases)
    inputs = {Path(p).name: sha256_file(Path(p)) for p in resolved.debs.values()}
    if src_file is not None:
        inputs[src_file.name] = sha256_file(src_file)
    inputs |= {p.name: sha256_file(p) for p in companion_files.values()}
    params = build_params(req, resolved, build_root)
    digest = input_digest(inputs, params)
    name = artifact_name(
        "kmod", resolved.driver_version, flavour=resolved.flavour, kernel_release=resolved.kernel_release
    )
    notes: list[str] = []
    log_path = req.cache / "logs" / f"{name.removesuffix('.tar.zst')}.log"

    hit = None if req.rebuild else store_hit(store, name, digest)
    if hit is not None:
        log.info("%s is up to date in %s (input digest %s…): nothing to build", name, store.path, digest[:12])
        us = _userspace_last(req, archive, store, resolved, notes, phases, background, build_root)
        return BuildResult(
            hit,
            read_manifest(hit),
            cached=True,
            compiled=False,
            input_digest=digest,
            userspace=us,
            log_path=None,
            duration_s=time.monotonic() - start,
            notes=notes,
            phases=dict(phases.seconds),
        )

    timings: dict[str, float] = {"resolve": round(time.monotonic() - start, 2)}
    cleanup: list[threading.Thread] = []  # the workspace is deleted while we pack
    try:
        modules_dir, info = compile_in_root(
            req, resolved, src_file, build_root, log_path=log_path, phases=phases, timings=timings,
            cleanup=cleanup, companion_files=companion_files,
        )
        manifest = pack_and_publish(
            req, resolved, src_file, build_root, archive, store, inputs, digest, name, modules_dir, info,
            phases=phases, timings=timings,
        )
        us = _userspace_last(req, archive, store, resolved, notes, phases, background, build_root)
        return BuildResult(
            store.path / name,
            manifest,
            cached=False,
            compiled=bool(info.get("compiled")),
            input_digest=digest,
            userspace=us,
            log_path=log_path if info.get("compiled") else None,
            duration_s=time.monotonic() - start,
            notes=notes,
            timings=timings,
            phases=dict(phases.seconds),
        )
    finally:
        with timed(timings, "cleanup_wait"):
            for thread in cleanup:
                thread.join()
