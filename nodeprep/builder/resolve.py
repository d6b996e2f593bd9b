"""The inputs of one kmod build: the request, its validation, and resolving (and downloading) them.

    validate_request -> resolve_inputs (Debian archive, a .run installer or an open-gpu-kernel-modules
    release; headers from the archive)
    or resolve_host_inputs (--builder host: the system's headers) -> build_params.

Owns BuildRequest (with its TargetOS, resolved from `--os` where the request is made) and ResolvedInputs,
the archive of a request (`open_archive`, lazily for host builds), the fetch of a runfile or
open-source release (the source file), and `build_params`: everything besides the input files that
decides the artifact's bytes (with the input files it makes the input digest, the store key of a
build).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import paths, targets
from ..artifact import artifact_name
from ..atomicfile import atomic_write
from ..digests import canonical_json, sha256_bytes, sha256_file
from ..errors import InputError
from ..log import step
from ..progress import Phases
from ..sources import companions, drivers, opensource, runfile
from ..targets import TargetOS
from ..vocab import DRIVER_REQUEST_RE, DRIVER_VERSION, DRIVER_VERSION_RE, FLAVOURS
from . import buildroot, fabricmanager, headers, hostbuild
from .companionbuild import FORMAT

BUILD_FORMAT = 1  # bump when the build procedure changes its output
BUILDERS = ("chroot", "host", "podman", "docker")
AnyBuildRoot = buildroot.BuildRoot | hostbuild.HostRoot


@dataclass(frozen=True)
class BuildRequest:
    """What to build: one (driver, flavour, OS, kernel) cell, where to publish it, and how."""

    driver: str | None = None  # exact version, branch ("535") or None for the newest
    flavour: str = "proprietary"
    target: TargetOS = targets.get(targets.DEFAULT)  # resolved once, where the request is made
    kernel: str | None = None  # None: the OS's current default kernel
    arch: str = "amd64"
    store: Path = paths.DEFAULT_STORE
    cache: Path = field(default_factory=paths.default_cache)
    runfile: str | None = None  # URL/path of an NVIDIA .run installer instead of Debian's sources
    runfile_sha256: str | None = None
    # URL/path of an NVIDIA open-gpu-kernel-modules release tarball (the open flavour's sources);
    # with `runfile` too, that runfile is the user space's and must be of the same version
    open_source: str | None = None
    open_source_sha256: str | None = None
    # URL/path of a `git archive` of NVIDIA's nvidia-persistenced at the driver's version: built in
    # the build root into the user-space artifact (builder.persistenced) instead of Debian's binary
    persistenced_source: str | None = None
    persistenced_sha256: str | None = None
    # URL/path of NVIDIA's fabricmanager-linux-<arch>-<version>-archive.tar.xz at the driver's version:
    # its daemon, library, configuration and topologies go into the user-space artifact
    fabricmanager: str | None = None
    fabricmanager_sha256: str | None = None
    jobs: int | None = None
    rebuild: bool = False
    allow_cc_mismatch: bool = False
    userspace: bool = True
    sign_key: Path | None = None
    sign_cert: Path | None = None
    sign_hash: str = "sha256"
    smoke_test: bool | None = None  # None: the target OS's default (on where qemu boots its kernel)
    builder: str = "chroot"  # "chroot" (mmdebstrap build root) or "host" (this system's headers)
    headers_dir: Path | None = None  # --builder host: the headers tree (default: discovered)
    # a Debian suite of the target (TargetOS.driver_suites) the driver sources and user space come from
    driver_suite: str | None = None
    # GPUDirect companion modules compiled beside the driver into the same kmod artifact:
    # (name of sources.companions.COMPANIONS, URL or path of its tarball, sha256)
    companions: tuple[tuple[str, str, str], ...] = ()


@dataclass(frozen=True)
class ResolvedInputs:
    """Everything resolved about the inputs of one build (JSON-serialisable)."""

    driver_version: str
    flavour: str
    kernel_release: str
    # {"kind": "debian", "package", "version"}, {"kind": "runfile", "url", "name"} or
    # {"kind": "open-source", "url", "name"}
    source: dict[str, str]
    debs: dict[str, str]  # role ("source", "headers", ...) -> .deb path
    header_packages: list[list[str]]


def open_archive(req: BuildRequest, *, read_only: bool = False) -> Any:
    """`read_only`: answers from the cached package lists, writes nothing (build-driver --check)."""
    # lazy: Ansible nodeprep_build
    from ..sources.debian import DebianArchive

    # The archive of the target OS and the kernel's line; an OS that borrows another's driver
    # sources and user space gets that OS's archive (nodeprep.targets says which).
    kernel = targets.line_kernel(req.target, req.kernel, req.builder)
    return DebianArchive(req.cache, os_name=req.target.name, arch=req.arch, kernel=kernel,
                         driver_suite=req.driver_suite, read_only=read_only)


class LazyArchive:
    """The Debian archive, created on first use: a host build from a runfile never needs apt."""

    def __init__(self, req: BuildRequest, *, read_only: bool = False) -> None:
        self._req = req
        self._read_only = read_only
        self._real: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._real is None:
            self._real = open_archive(self._req, read_only=self._read_only)
        return getattr(self._real, name)


def _lists_fingerprint(archive: Any) -> str | None:
    """Identity of the apt lists the archive answers from (None: unknown, do not memoise)."""
    lists = Path(getattr(archive, "dir", "")) / "lists"
    if not getattr(archive, "dir", None) or not lists.is_dir():
        return None
    entries = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in lists.iterdir() if p.is_file())
    return sha256_bytes(canonical_json(entries)) if entries else None


def _runfile_version(name: str, header: runfile.MakeselfHeader | None) -> str | None:
    texts = (name,) if header is None else (name, header.label, header.targetdir)
    for text in texts:
        m = re.search(f"({DRIVER_VERSION})", text or "")
        if m:
            return m[1]
    return None


def resolve_inputs(
    req: BuildRequest, archive: Any, phases: Phases | None = None
) -> tuple[ResolvedInputs, Path | None]:
    """Resolve and download every input. Returns the resolved inputs and the source file (the runfile or the
    open-source release; None for Debian's sources).

    The answers for the Debian archive are memoised per apt lists state (same lists -> same answers)
    so a cache hit costs no apt queries."""
    # the source file first: a release and runfile of different versions are refused before apt runs
    src_file = _fetch_source_file(req, phases)
    archive.update()  # cheap while the lists are fresh; refreshed lists give new answers (and a new memo key)
    memo_key = sha256_bytes(
        canonical_json(
            {
                "driver": req.driver,
                "flavour": req.flavour,
                "os": req.target.name,
                "kernel": req.kernel,
                "arch": req.arch,
                "runfile": req.runfile,
                "sha256": req.runfile_sha256,
                "open_source": req.open_source,
                "open_source_sha256": req.open_source_sha256,
                "driver_suite": req.driver_suite,
                "lists": _lists_fingerprint(archive),
            }
        )
    )
    memo = req.cache / "plans" / f"{memo_key}.json"
    if _lists_fingerprint(archive) and memo.is_file():
        resolved = ResolvedInputs(**json.loads(memo.read_text()))
        if all(Path(p).is_file() for p in resolved.debs.values()):
            return resolved, src_file
    version, source = _driver_source(req, archive, src_file)
    hdrs = headers.resolve(archive, req.kernel, arch=req.arch)
    wanted = ([("source", source["package"], source["version"])] if src_file is None else []) + [
        (pkg, pkg, ver) for pkg, ver in hdrs.packages
    ]
    fetched = archive.download_many(
        [(pkg, ver) for _, pkg, ver in wanted], phases.reporter("resolve", "bytes") if phases else None
    )
    debs = {role: str(path) for (role, _, _), path in zip(wanted, fetched, strict=True)}
    resolved = ResolvedInputs(
        driver_version=version,
        flavour=req.flavour,
        kernel_release=hdrs.release,
        source=source,
        debs=debs,
        header_packages=[list(p) for p in hdrs.packages],
    )
    if _lists_fingerprint(archive):
        atomic_write(memo, json.dumps(asdict(resolved), sort_keys=True))
    return resolved, src_file


def _fetch_runfile(req: BuildRequest, phases: Phases | None) -> Path | None:
    if not req.runfile:
        return None
    if not req.runfile_sha256:
        raise InputError("--runfile needs --sha256 (the installer's published sha256)")
    with step(f"Fetching {runfile.runfile_name(req.runfile)}"):
        return runfile.fetch(
            req.runfile,
            req.runfile_sha256,
            req.cache,
            progress=phases.reporter("resolve", "bytes") if phases else None,
        )


def _fetch_source_file(req: BuildRequest, phases: Phases | None) -> Path | None:
    """The file the kernel modules are built from: the open-source release (its version checked
    against the runfile's when one is given too), else the runfile; None: Debian's sources."""
    if not req.open_source:
        return _fetch_runfile(req, phases)
    if not req.open_source_sha256:
        raise InputError("--open-source needs --open-source-sha256 (the release tarball's sha256)")
    with step(f"Fetching {opensource.release_name(req.open_source)}"):
        release = opensource.fetch(
            req.open_source,
            req.open_source_sha256,
            req.cache,
            progress=phases.reporter("resolve", "bytes") if phases else None,
        )
    version = opensource.read_version(release)
    run_path = _fetch_runfile(req, phases)
    if run_path is not None:
        check_same_version(version, release.name, _installer_version(run_path), run_path.name)
    return release


def _check_pinned(option: str, source: str | None, sha_option: str, sha: str | None) -> str:
    """`source`, given by `option` and pinned: both given, the sha256 as 64 hex digits."""
    if not source:
        raise InputError(f"{sha_option} is only used with {option}")
    if not sha:
        raise InputError(f"{option} needs {sha_option} (the archive's sha256)")
    if not re.fullmatch(r"[0-9a-fA-F]{64}", sha):
        raise InputError(f"{sha_option}: {sha!r} is not a sha256 hex digest (64 hex digits)")
    return source


def check_persistenced_request(req: BuildRequest) -> None:
    """--persistenced-source: pinned, built in the chroot build root, for a user space made from Debian's
    packages (a runfile ships the driver's own), its version the driver's when both names carry one."""
    source = _check_pinned("--persistenced-source", req.persistenced_source, "--persistenced-sha256",
                  req.persistenced_sha256)
    if req.builder == "host":
        raise InputError("--persistenced-source: built with the target OS's toolchain in the chroot build "
                         "root, not with --builder host")
    if req.runfile:
        raise InputError("--persistenced-source: not with --runfile (the installer's own nvidia-persistenced "
                         "is the driver's version)")
    if not req.userspace:
        raise InputError("--persistenced-source goes into the user-space artifact: not with --no-userspace")
    named = opensource.name_version(opensource.release_name(source, "--persistenced-source"),
                                    "nvidia-persistenced")
    if named and req.driver and DRIVER_VERSION_RE.fullmatch(req.driver) and named != req.driver:
        raise InputError(f"--persistenced-source: {opensource.release_name(source)} is "
                         f"nvidia-persistenced {named}, the driver is {req.driver}: persistenced must be "
                         "the driver's exact version")


def check_fabricmanager_request(req: BuildRequest) -> None:
    """--fabricmanager: pinned, into the user space (Debian's packages or the runfile's), its name
    NVIDIA's archive name for the build's arch and, when --driver is an exact version, of that version."""
    source = _check_pinned("--fabricmanager", req.fabricmanager, "--fabricmanager-sha256",
                           req.fabricmanager_sha256)
    if not req.userspace:
        raise InputError("--fabricmanager goes into the user-space artifact: not with --no-userspace")
    exact = req.driver if req.driver and DRIVER_VERSION_RE.fullmatch(req.driver) else None
    if exact is None and req.runfile:  # the installer's name carries the driver's version
        exact = _runfile_version(runfile.runfile_name(req.runfile), None)
    fabricmanager.check_name(fabricmanager.archive_name(source), exact, req.arch)


def check_same_version(release_version: str, release: str, runfile_version: str, run_name: str) -> None:
    """A kmod from an open-source release takes the user space of NVIDIA's runfile of the same
    version: refuse a pair of different versions (before anything is built)."""
    if release_version != runfile_version:
        raise InputError(
            f"--runfile: {run_name} is driver {runfile_version}, but the open-source release {release} is "
            f"{release_version}: the kernel modules and the user space must be the same version"
        )


def _installer_version(run_path: Path) -> str:
    version = _runfile_version(run_path.name, runfile.read_header(run_path))
    if version is None:
        raise InputError(
            f"{run_path.name}: cannot tell the driver version (name it NVIDIA-Linux-<arch>-<version>.run)"
        )
    return version


def _driver_source(req: BuildRequest, archive: Any, src_file: Path | None) -> tuple[str, dict[str, str]]:
    """(driver version, source description) from the open-source release, the runfile or Debian's
    catalogue."""
    if src_file is not None and req.open_source:
        version = opensource.read_version(src_file)
        if req.driver and req.driver != version:
            raise InputError(
                f"--driver {req.driver} does not match the open-source release's version {version}"
            )
        return version, {"kind": "open-source", "url": req.open_source, "name": src_file.name}
    if src_file is not None:
        version = _installer_version(src_file)
        if req.driver and req.driver != version:
            raise InputError(f"--driver {req.driver} does not match the installer's version {version}")
        return version, {"kind": "runfile", "url": req.runfile or "", "name": src_file.name}
    kernel = targets.line_kernel(req.target, req.kernel, req.builder)
    chosen = drivers.resolve_for_target(archive, req.target, kernel, req.driver, req.flavour,
                                        req.driver_suite)
    suite = {"suite": req.driver_suite} if req.driver_suite else {}
    return chosen.driver_version, {
        "kind": "debian",
        "package": chosen.package,
        "version": chosen.debian_version,
        **suite,
    }


def resolve_host_inputs(
    req: BuildRequest, archive: Any, release: str, phases: Phases | None = None
) -> tuple[ResolvedInputs, Path | None]:
    """`--builder host`: the headers are the system's (no packages); only the driver sources are
    resolved (the source file, or Debian's kernel-source package, whose .deb is the one input file)."""
    src_file = _fetch_source_file(req, phases)
    if src_file is None:
        archive.update()
    version, source = _driver_source(req, archive, src_file)
    debs = (
        {}
        if src_file is not None
        else {"source": str(archive.download(source["package"], source["version"]))}
    )
    resolved = ResolvedInputs(
        driver_version=version,
        flavour=req.flavour,
        kernel_release=release,
        source=source,
        debs=debs,
        header_packages=[],
    )
    return resolved, src_file


def preview(req: BuildRequest, archive: Any, host_release: str | None = None) -> dict[str, Any]:
    """`build-driver --check`: the inputs a build would resolve and the artifact it would publish,
    from the archive's package index alone: no input is downloaded (a runfile's or release's version
    is read from its name), no build root made, no resolved-inputs memo or store written. `host_release`: the
    kernel of the host's headers (--builder host)."""
    named = None
    if req.open_source:
        named = opensource.name_version(opensource.release_name(req.open_source))
    elif req.runfile:
        named = _runfile_version(runfile.runfile_name(req.runfile), None)
    if req.open_source or req.runfile:
        kind, url = ("open-source", req.open_source) if req.open_source else ("runfile", req.runfile)
        version: str | None = named or req.driver
        if named and req.driver and req.driver != named:
            raise InputError(f"--driver {req.driver} does not match the {kind}'s version {named}")
        source = {"kind": kind, "url": url or ""}
        fetch = [f"{url} (sha256 {req.open_source_sha256 if req.open_source else req.runfile_sha256})"]
    else:
        version, source = _driver_source(req, archive, None)
        fetch = [f"{source['package']}={source['version']}"]
    fetch += [f"{url} (sha256 {sha})" for _, url, sha in req.companions]
    if host_release is not None:
        release, header_packages = host_release, []
    else:
        hdrs = headers.resolve(archive, req.kernel, arch=req.arch)
        release, header_packages = hdrs.release, [f"{p}={v}" for p, v in hdrs.packages]
    name = (artifact_name("kmod", version, flavour=req.flavour, kernel_release=release) if version
            else f"nvidia-kmod-<the {source['kind']}'s version>-{req.flavour}-{release}.tar.zst")
    out: dict[str, Any] = {
        "check": True, "driver_version": version, "flavour": req.flavour, "kernel_release": release,
        "os": req.target.name, "arch": req.arch, "builder": req.builder, "source": source,
        "would_fetch": fetch + header_packages, "artifact": name, "store": str(req.store),
        "in_store": (Path(req.store) / name).is_file(), "userspace": (
            artifact_name("userspace", version, arch=req.arch) if req.userspace and version else None),
    }
    if req.fabricmanager:
        out["fabricmanager"] = {"archive": req.fabricmanager, "sha256": req.fabricmanager_sha256}
    if req.persistenced_source:
        out["persistenced"] = {"source": req.persistenced_source, "sha256": req.persistenced_sha256,
                               "build_packages": list(req.target.tools_packages)}
    if req.builder != "host":
        recipe = buildroot.recipe_for(req.target, req.kernel, buildroot_extra(req))
        out["build_root"] = {"key": recipe.key, "cached": buildroot.cached(recipe, req.cache)}
    return out


def build_params(req: BuildRequest, resolved: ResolvedInputs, build_root: AnyBuildRoot) -> dict[str, Any]:
    """Everything besides the input files that decides the artifact's bytes."""
    return {
        "build_format": BUILD_FORMAT,
        "kind": "kmod",
        "driver_version": resolved.driver_version,
        "flavour": resolved.flavour,
        "kernel_release": resolved.kernel_release,
        "os": req.target.name,
        "arch": req.arch,
        "build_root": {"key": build_root.recipe.key, "packages": list(build_root.packages)},
        "source": {k: v for k, v in resolved.source.items() if k != "url"},
        "signing": (
            {"cert_sha256": sha256_file(req.sign_cert), "hash": req.sign_hash} if req.sign_cert else None
        ),
        "smoke_test": bool(req.smoke_test),
        "allow_cc_mismatch": req.allow_cc_mismatch,
    } | _companion_params(req)


def _companion_params(req: BuildRequest) -> dict[str, Any]:
    """The companions' part of the parameters: only when there are any (other builds keep their digest)."""
    if not req.companions:
        return {}
    return {"companions": {"format": FORMAT, "names": sorted(n for n, _, _ in req.companions)}}


def validate_companions(req: BuildRequest) -> None:
    """Each companion once, known, with a sha256 and a tarball of its project's name; chroot builds only."""
    seen: set[str] = set()
    for name, url, sha in req.companions:
        if name not in companions.COMPANIONS:
            raise InputError(f"companion {name!r} is not one of {', '.join(companions.COMPANIONS)}")
        option = companions.COMPANIONS[name].option
        if name in seen:
            raise InputError(f"{option}: given twice")
        seen.add(name)
        if not re.fullmatch(r"[0-9a-fA-F]{64}", sha or ""):
            raise InputError(f"{option}-sha256: {sha!r} is not a sha256 hex digest (64 hex digits)")
        companions.check_name(companions.COMPANIONS[name], url)
    if req.companions and req.builder == "host":
        option = companions.COMPANIONS[req.companions[0][0]].option
        raise InputError(f"{option}: the GPUDirect modules are built in the build root "
                         "(--builder chroot, podman or docker), not with --builder host")


def fetch_companions(req: BuildRequest, phases: Phases | None = None) -> dict[str, Path]:
    """The companions' tarballs, downloaded into the cache and sha256-checked (name -> path)."""
    out = {}
    for name, url, sha in req.companions:
        companion = companions.COMPANIONS[name]
        with step(f"Fetching {companions.archive_name(url, companion.option)}"):
            out[name] = companions.fetch(companion, url, sha, req.cache,
                                         progress=phases.reporter("resolve", "bytes") if phases else None)
    return out


def buildroot_extra(req: BuildRequest) -> tuple[str, ...]:
    """Packages the request's driver sources need in the build root beyond the target's recipe."""
    if not req.open_source:
        return ()
    target = req.target
    return opensource.build_packages(targets.channel(target, req.kernel).compiler or target.compiler)


def validate_request(req: BuildRequest) -> None:
    """Refuse bad input before anything is downloaded or written (InputError, exit 2)."""
    target = req.target
    if req.builder == "host":
        if req.smoke_test and not target.smoke_boot:
            raise InputError(
                f"--smoke-test: boots Debian kernels only, not {target.name} (use --no-smoke-test)"
            )
    else:
        buildroot.recipe_for(target, req.kernel, buildroot_extra(req))
        targets.channel(target, req.kernel)
        if req.headers_dir is not None:
            raise InputError("--headers-dir is only used with --builder host")
    if req.driver_suite is not None:
        if req.driver_suite not in target.driver_suites:
            raise InputError(f"--driver-suite: {req.driver_suite!r} is not a driver suite of {target.name} "
                             f"(known: {', '.join(target.driver_suites) or 'none'})")
        if req.kernel is None:
            raise InputError("--driver-suite needs --kernel: the suite's own default kernel is not one "
                             f"of {target.name}'s")
        if req.runfile or req.open_source:
            raise InputError("--driver-suite chooses Debian's driver sources: not with --runfile or "
                             "--open-source")
    if req.flavour not in FLAVOURS:
        raise InputError(f"--flavour: {req.flavour!r} is not one of {', '.join(FLAVOURS)}")
    if req.driver is not None and not DRIVER_REQUEST_RE.fullmatch(req.driver):
        raise InputError(
            f"--driver: {req.driver!r} is not a driver version (like 535.309.01) or branch (535)"
        )
    if req.runfile and not req.runfile_sha256:
        raise InputError("--runfile needs --sha256 (the installer's published sha256)")
    if req.runfile_sha256 and not re.fullmatch(r"[0-9a-fA-F]{64}", req.runfile_sha256):
        raise InputError(f"--sha256: {req.runfile_sha256!r} is not a sha256 hex digest (64 hex digits)")
    if req.open_source:
        if not req.open_source_sha256:
            raise InputError("--open-source needs --open-source-sha256 (the release tarball's sha256)")
        if req.flavour != "open":
            raise InputError(f"--open-source: a release of NVIDIA's open kernel modules builds the open "
                             f"flavour, not {req.flavour} (--flavour open)")
    if req.open_source_sha256 and not re.fullmatch(r"[0-9a-fA-F]{64}", req.open_source_sha256):
        raise InputError(
            f"--open-source-sha256: {req.open_source_sha256!r} is not a sha256 hex digest (64 hex digits)"
        )
    if req.open_source and req.runfile:
        # both names carry their versions: a mismatch is refused before anything is downloaded
        # (the files' own versions are checked again once they are here)
        release, run_name = opensource.release_name(req.open_source), runfile.runfile_name(req.runfile)
        named, run_named = opensource.name_version(release), _runfile_version(run_name, None)
        if named and run_named:
            check_same_version(named, release, run_named, run_name)
    if req.persistenced_source or req.persistenced_sha256:
        check_persistenced_request(req)
    if req.fabricmanager or req.fabricmanager_sha256:
        check_fabricmanager_request(req)
    validate_companions(req)
    if req.sign_key or req.sign_cert:
        if not (req.sign_key and req.sign_cert):
            raise InputError("--sign-key and --sign-cert go together")
        for what, p in (("--sign-key", req.sign_key), ("--sign-cert", req.sign_cert)):
            if not (what == "--sign-key" and str(p).startswith("pkcs11:")) and not Path(p).is_file():
                raise InputError(f"{what}: {p} does not exist")
        if req.sign_hash not in ("sha256", "sha384", "sha512"):
            raise InputError(f"--sign-hash: {req.sign_hash!r} is not one of sha256, sha384, sha512")
