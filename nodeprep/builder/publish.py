"""Packing and publishing: the kmod artifact, store hits, the user-space artifact, and pushing a
directory store to an OCI registry.

    store_hit (same name and input digest, intact file) -> nothing to build.
    otherwise: compiled modules -> payload -> [sign] -> [smoke test] -> manifest -> pack -> publish.
    user space: prebuild_userspace in a thread while the build root is made; publish_userspace at
    the end (reused when current, skipped with a note where its sources are out of reach).
    registry (`--store oci://…`): the build publishes into a staging directory store under the
    cache (`staging_target`), which is pushed afterwards (`push`); a container build gets a fresh
    staging store and the host pushes it (`container_to_registry`), so credentials stay outside.

Everything temporary lives under `<cache>/tmp` and is removed (and unmounted) on any exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import threading
from pathlib import Path
from typing import Any

from .. import __version__, runner
from ..artifact import LocalStore, Manifest, artifact_name, pack, read_manifest, sha256_listed
from ..errors import ArtifactError, BuildError, InputError, NodeprepError
from ..log import step, timed
from ..modinfo import read_module
from ..progress import Phases
from ..sources import opensource, runfile
from ..stores import is_oci
from . import (
    buildroot,
    fabricmanager,
    hostbuild,
    kbuild,
    persistenced,
    runfileuserspace,
    signing,
    smoke,
    userspace,
)
from .resolve import BUILD_FORMAT, AnyBuildRoot, BuildRequest, ResolvedInputs

log = logging.getLogger(__name__)


def store_hit(store: LocalStore, name: str, digest: str) -> Path | None:
    """The published `name` when its input digest is `digest` and its file is intact, else None."""
    try:
        entry = store.lookup(name)
        intact = entry is not None and sha256_listed(store.path, name) == entry.sha256
    except (InputError, ArtifactError):
        return None
    if entry and entry.input_digest == digest and intact:
        return store.path / name
    return None


def current_userspace(path: Path) -> bool:
    """A published user-space artifact is reused only when this nodeprep would make it the same way
    (a layout or compression change rebuilds it from the cached packages)."""
    try:
        return userspace.is_current(read_manifest(path))
    except ArtifactError:
        return False


def publish_userspace(
    req: BuildRequest,
    archive: Any,
    store: LocalStore,
    driver_version: str,
    notes: list[str],
    phases: Phases | None = None,
    build_root: AnyBuildRoot | None = None,
) -> Path | None:
    """The user-space artifact of `driver_version` in the store: reused when current, else built
    and published; None (with a note) when it is skipped. `build_root`: the build root nvidia-persistenced
    is built in (--persistenced-source)."""
    name = artifact_name("userspace", driver_version, arch=req.arch)
    if not req.rebuild:
        try:
            entry = store.lookup(name)
        except InputError:
            entry = None
        found = store.path / name
        if (entry and found.is_file() and current_userspace(found) and _same_persistenced(req, found)
                and _same_fabricmanager(req, found)):
            _warn_persistenced(store.path / name)
            return store.path / name
    # User space is distribution-independent: host builds for any OS take it from Debian's archive
    # when Debian serves that driver version; where Debian (or apt) is out of reach, it is skipped.
    soft: tuple[type[Exception], ...] = (
        (NodeprepError,)
        if req.builder == "host" and req.target.borrows_sources
        else (InputError,)
    )
    if req.runfile:
        soft = ()  # a runfile's own user space is never skipped: what is wrong with it is refused
    phases = phases or Phases()
    text = f"Building the user-space artifact for {driver_version}"
    with step(text), phases.phase("userspace", text):
        try:
            path, manifest = _make_userspace(req, archive, driver_version, phases, build_root)
        except soft as e:
            notes.append(f"user-space artifact skipped: {e}")
            log.warning("warning: user-space artifact skipped: %s", e)
            return None
        store.publish(Path(path), manifest)
    _warn_persistenced(store.path / name)
    return store.path / name


def _same_persistenced(req: BuildRequest, path: Path) -> bool:
    """A published user space is reused only when its nvidia-persistenced came from what the request
    asks: the --persistenced-source archive (by sha256), or no source when none is given."""
    try:
        rec = read_manifest(path).extra.get("persistenced")
    except ArtifactError:
        return False
    from_source = isinstance(rec, dict) and rec.get("from") == "source"
    if not req.persistenced_source:
        return not from_source
    want = (req.persistenced_sha256 or "").lower()
    return from_source and isinstance(rec, dict) and rec.get("sha256") == want


def _same_fabricmanager(req: BuildRequest, path: Path) -> bool:
    """A published user space is reused only with the Fabric Manager the request asks for (by sha256)."""
    try:
        rec = read_manifest(path).extra.get("fabricmanager")
    except ArtifactError:
        return False
    have = rec.get("sha256") if isinstance(rec, dict) else None
    return have == (req.fabricmanager_sha256.lower() if req.fabricmanager_sha256 else None)


def check_fabricmanager(req: BuildRequest, driver_version: str) -> fabricmanager.FabricManager | None:
    """With --fabricmanager: the archive fetched (sha256 checked), its version checked against the
    driver's and its members read, before a build root or a compile; None without one."""
    if not (req.fabricmanager and req.userspace):
        return None
    assert req.fabricmanager_sha256
    path = fabricmanager.fetch(req.fabricmanager, req.fabricmanager_sha256, req.cache)
    return fabricmanager.read_archive(path, req.fabricmanager_sha256.lower(), driver_version, req.arch)


def _warn_persistenced(path: Path) -> None:
    """One warning line when the published user space's nvidia-persistenced is not the driver's version."""
    try:
        line = userspace.persistenced_warning(read_manifest(path))
    except ArtifactError:
        return
    if line:  # one line on stderr (not a note as well: it would print twice)
        log.warning("warning: %s", line)


def check_persistenced(req: BuildRequest, driver_version: str) -> Path | None:
    """With --persistenced-source: the archive fetched (sha256 checked) and its version checked against
    the driver's, before a build root or a compile (InputError naming both); None without one."""
    if not (req.persistenced_source and req.userspace):
        return None
    assert req.persistenced_sha256
    src = opensource.fetch(req.persistenced_source, req.persistenced_sha256, req.cache,
                           flag="--persistenced-source")
    persistenced.check_version(persistenced.source_version(src), driver_version, src.name)
    return src


def _built_persistenced(req: BuildRequest, archive: Any, driver_version: str,
                        build_root: AnyBuildRoot | None) -> persistenced.Built | None:
    src = check_persistenced(req, driver_version)
    if src is None:
        return None
    if not isinstance(build_root, buildroot.BuildRoot):
        raise InputError("--persistenced-source: built in the chroot build root, which this build lacks")
    assert req.persistenced_sha256
    with step(f"Building nvidia-persistenced {driver_version} from {src.name}"):
        return persistenced.build(src, req.persistenced_sha256.lower(), driver_version, build_root, archive,
                                  req.target, req.cache, arch=req.arch, jobs=req.jobs, rebuild=req.rebuild)


def _userspace_cache(req: BuildRequest) -> Path:
    """The cache folder of the request's user-space artifact. Every variant has the same artifact name,
    so each has its own folder (in one, each would replace the other and be remade on every other
    build): a runfile's, and one with a persistenced built from source or a Fabric Manager archive,
    named by those inputs' digests."""
    folder = req.cache / "userspace" / "runfile" if req.runfile else req.cache / "userspace"
    extras = [f"{name}-{sha.lower()[:16]}" for name, sha in
              (("persistenced", req.persistenced_sha256 if req.persistenced_source else None),
               ("fabricmanager", req.fabricmanager_sha256 if req.fabricmanager else None)) if sha]
    return folder / "+".join(extras) if extras else folder


def _make_userspace(
    req: BuildRequest, archive: Any, driver_version: str, phases: Phases,
    build_root: AnyBuildRoot | None = None,
) -> tuple[Path, Manifest]:
    """The user-space artifact of `driver_version` in the cache: from the runfile's own files when
    the request has one, else from Debian's packages."""
    if req.runfile:
        assert req.runfile_sha256
        run = runfile.fetch(req.runfile, req.runfile_sha256, req.cache)  # a cache hit: fetched by resolve
        return runfileuserspace.build_userspace(
            run, driver_version, _userspace_cache(req), arch=req.arch, os_name=req.target.name,
            fabricmanager=check_fabricmanager(req, driver_version),
        )
    built = _built_persistenced(req, archive, driver_version, build_root)
    fm = check_fabricmanager(req, driver_version)
    return userspace.build_userspace(
        archive,
        driver_version,
        _userspace_cache(req),
        arch=req.arch,
        progress=phases.reporter("userspace", "bytes"),
        persistenced=built,
        fabricmanager=fm,
    )


def runfile_userspace(req: BuildRequest, driver_version: str, phases: Phases) -> None:
    """With --runfile: make its user-space artifact in the cache now, before the build root or a
    compile, so an installer whose `.manifest` is of another version (or lacks the libraries) is
    refused before anything is built; `publish_userspace` publishes it at the end."""
    if not (req.runfile and req.userspace):
        return
    text = f"User-space artifact from {runfile.runfile_name(req.runfile)}"
    with step(text), phases.phase("userspace", text):
        _make_userspace(req, None, driver_version, phases)


def prebuild_userspace(
    req: BuildRequest,
    archive: Any,
    store: LocalStore,
    driver_version: str,
    phases: Phases,
    background: list[threading.Thread],
) -> None:
    """Make the user-space artifact in the cache in a thread (not published: `publish_userspace`
    does that at the end, then finding it ready by its input digest). Errors are left to that call."""
    published = store.path / artifact_name("userspace", driver_version, arch=req.arch)
    if not req.userspace or req.runfile or req.persistenced_source or req.fabricmanager or (
            published.exists() and current_userspace(published)):
        return  # a runfile's user space is made before the build root (runfile_userspace); one with
        # nvidia-persistenced from source needs the build root

    def run() -> None:
        text = "User-space artifact (while the build root is made)"
        with contextlib.suppress(Exception), phases.phase("userspace", text):
            userspace.build_userspace(
                archive,
                driver_version,
                req.cache / "userspace",
                arch=req.arch,
                progress=phases.reporter("userspace", "bytes"),
            )

    thread = threading.Thread(target=run, name="userspace-prebuild", daemon=True)
    thread.start()
    background.append(thread)


def pack_and_publish(
    req: BuildRequest,
    resolved: ResolvedInputs,
    src_file: Path | None,
    build_root: AnyBuildRoot,
    archive: Any,
    store: LocalStore,
    inputs: dict[str, str],
    digest: str,
    name: str,
    modules_dir: Path,
    info: dict[str, Any],
    *,
    phases: Phases,
    timings: dict[str, float],
) -> Manifest:
    """Copy the compiled modules of `modules_dir` into a payload, [sign], [smoke-test], write the
    manifest, pack `name` and publish it; returns the packed manifest. Nothing is published when
    the smoke test fails (BuildError)."""
    smoke_on = bool(req.smoke_test)
    tmp_parent = req.cache / "tmp"
    tmp_parent.mkdir(parents=True, exist_ok=True)
    work = buildroot.private_dir(tmp_parent, "pack")
    try:
        payload = work / "payload"
        mod_dir = payload / "modules" / resolved.kernel_release
        mod_dir.mkdir(parents=True)
        for ko in json.loads((modules_dir / "modules.json").read_text())["modules"]:
            shutil.copyfile(modules_dir / ko, mod_dir / ko)
            os.chmod(mod_dir / ko, 0o644)
        companions = info.get("companions")
        if companions:  # the GPUDirect modules, compiled beside the driver (builder/companionbuild.py)
            cdir = Path(companions["dir"])
            for ko in json.loads((cdir / "modules.json").read_text())["modules"]:
                shutil.copyfile(cdir / ko, mod_dir / ko)
                os.chmod(mod_dir / ko, 0o644)
        vermagic = read_module(mod_dir / "nvidia.ko").vermagic.strip()
        extra: dict[str, Any] = {
            "source": {k: v for k, v in resolved.source.items() if k != "url"}
            | ({"sha256": inputs[src_file.name]} if src_file else {}),
            "kernel_headers": (
                {"dir": str(build_root.headers_dir), "sha256": build_root.headers_sha256}
                if isinstance(build_root, hostbuild.HostRoot)
                else {p: v for p, v in resolved.header_packages}
            ),
            "build_root": {
                "os": req.target.name,
                "key": build_root.recipe.key,
                "packages_sha256": build_root.packages_sha256,
                "packages": list(build_root.packages),
            },
            "build": {
                "format": BUILD_FORMAT,
                "compile_key": info["compile_key"],
                "build_compiler": info["build_compiler"],
                "path": kbuild.BUILD_DIR,
                **({"cc_mismatch": info["cc_mismatch"]} if "cc_mismatch" in info else {}),
            },
        }
        if companions:
            extra["companions"] = {"compile_key": companions["compile_key"], "modules": companions["modules"],
                                   "sources": {n: {"name": Path(u).name, "sha256": sha}
                                               for n, u, sha in req.companions}}
        if req.sign_key and req.sign_cert:
            signing_headers = _headers_tree(req, resolved, build_root)
            with timed(timings, "sign", "Signing the modules"), signing_headers as hdir:
                extra["signing"] = signing.sign_modules(
                    mod_dir, hdir, Path(req.sign_key), Path(req.sign_cert), req.sign_hash
                )
        if smoke_on:
            text = f"Smoke-testing the modules on {resolved.kernel_release}"
            with timed(timings, "smoke_test", text), phases.phase("smoke_test", text):
                result = smoke.smoke_test_modules(
                    mod_dir,
                    resolved.kernel_release,
                    archive=archive,
                    cache=req.cache,
                    # Signed modules boot under UEFI Secure Boot with the signing certificate
                    # enrolled, as on a node that enrolled it: they must load under lockdown.
                    trusted_cert=Path(req.sign_cert) if req.sign_key and req.sign_cert else None,
                )
            extra["smoke_test"] = result.to_dict()
            if not result.passed:
                raise BuildError(
                    f"smoke test failed on {resolved.kernel_release}: "
                    f"{getattr(result, 'reason', 'see the log')}; not publishing "
                    "(--no-smoke-test skips it)",
                    hint=getattr(result, "log_excerpt", None) or None,
                )
        manifest = Manifest(
            kind="kmod",
            driver_version=resolved.driver_version,
            arch=req.arch,
            os=req.target.name,
            input_digest=digest,
            inputs=inputs,
            flavour=resolved.flavour,
            kernel_release=resolved.kernel_release,
            vermagic=vermagic,
            compiler=info["compiler"],
            extra=extra,
            nodeprep_version=__version__,
        )
        with phases.phase("pack", f"Packing {name}"):
            with timed(timings, "pack", f"Packing {name}"):
                path, manifest = pack(payload, manifest, work / "out")
            with timed(timings, "publish"):
                store.publish(path, manifest)
    finally:
        buildroot.remove_tree(work)
    return manifest


class _headers_tree:
    """Context manager: the arch-specific headers of `resolved` extracted in a temporary root
    (the signing hook needs scripts/sign-file and the kernel's certs there)."""

    def __init__(self, req: BuildRequest, resolved: ResolvedInputs, build_root: AnyBuildRoot) -> None:
        self.req, self.resolved, self.build_root = req, resolved, build_root
        self.tmp: Path | None = None

    def __enter__(self) -> Path:
        if isinstance(self.build_root, hostbuild.HostRoot):
            return self.build_root.headers_dir  # the system's own headers (scripts/sign-file, certs)
        self.tmp = buildroot.private_dir(self.req.cache / "tmp", "headers")
        for deb in [self.resolved.debs[p] for p, _ in self.resolved.header_packages]:
            runner.run(["dpkg-deb", "-x", deb, self.tmp])
        return self.tmp / "usr" / "src" / f"linux-headers-{self.resolved.kernel_release}"

    def __exit__(self, *exc: object) -> None:
        if self.tmp is not None:
            buildroot.remove_tree(self.tmp)


# ---------------------------------------------------------------------------------------------
# Publishing to an OCI registry


def staging_target(store: str, cache: Path, options: Any) -> tuple[Path, str | None]:
    """(directory the build publishes to, registry location to push it to afterwards or None):
    a directory `store` is itself; an `oci://` one is built into `<cache>/oci-publish/<repo>`."""
    if not is_oci(store):
        return Path(store), None
    # lazy: Ansible nodeprep_build
    from ..stores.ref import parse_ref

    ref = parse_ref(store, insecure_http=options.insecure_http)
    if ref.digest:
        raise InputError(f"--store: {store!r}: a digest pins what nodes read; publish to the repository")
    safe = f"{ref.host}/{ref.repository}".replace(":", "_")
    return cache / "oci-publish" / safe, store


def check_push_source(source: Path, registry: str) -> None:
    """`artifacts push`: REGISTRY is an oci:// reference and SOURCE a store directory that passes
    verification (InputError otherwise, before the registry is contacted)."""
    # lazy: Ansible nodeprep_build
    from ..stores.storecheck import check_store

    if not is_oci(registry):
        raise InputError(f"REGISTRY: {registry!r} is not an oci:// reference")
    if not source.is_dir():
        raise InputError(f"{source}: store directory does not exist")
    problems = check_store(source)
    if problems:
        raise InputError(f"{source}: refusing to push a store that fails verification: {problems[0]}")


def push_selection(source: Path, names: tuple[str, ...]) -> tuple[list[Any], list[str]]:
    """(the index entries of the directory store `source` that `push` sends for `names`, default
    all; the names it does not hold)."""
    entries = LocalStore(source).entries()
    chosen = [e for e in entries if not names or e.name in names]
    return chosen, sorted(set(names) - {e.name for e in entries})


def push(location: str, staging: Path, names: list[str] | None, options: Any) -> tuple[str, int]:
    """Push `names` (default: everything) of the directory store `staging` to the registry
    `location`; returns (the new index digest, how many artifacts)."""
    # lazy: Ansible nodeprep_build
    from ..stores import oci

    reg = oci.connect(location, options, push=True)
    return oci.publish_directory(reg, staging, names)


def container_to_registry(builder: str, req: BuildRequest, registry: str, options: Any, *,
                          capture: bool) -> tuple[Any, tuple[str, int] | None]:
    """build-driver --builder podman|docker --store oci://...: the container builds into a fresh
    directory store under the cache (it never sees the registry or its credentials); on success
    the host pushes everything in it, then removes it. Returns the container's result and what was
    pushed (None when the build failed)."""
    # lazy: Ansible nodeprep_build
    from . import containerbuild

    staging = containerbuild.staging_store(req.cache)
    try:
        cb = containerbuild.for_request(builder, dataclasses.replace(req, store=staging), as_json=capture)
        res = containerbuild.run_in_container(cb, capture=capture)
        if res.returncode != 0:
            return res, None
        names = [e.name for e in LocalStore(staging).entries()]
        return res, push(registry, staging, names, options)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
