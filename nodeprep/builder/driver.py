"""build-driver: NVIDIA kernel modules for one (driver, flavour, OS, kernel release) -> store.

    resolve inputs (Debian archive or a .run installer) -> input digest -> store hit? done.
    otherwise: build root clone -> headers + sources at fixed paths -> compiler check -> kbuild
    -> strip -> [sign] -> [smoke test] -> pack -> publish; then the user-space artifact.

Same inputs give the same input digest and, on a hit, no compile at all. Compiled (stripped,
unsigned) modules are also kept by *compile key* (digest of the source tree itself, the headers
and the build root), so an installer whose kernel tree is byte-identical to Debian's reuses them.
Everything temporary lives under `<cache>/tmp` and is removed (and unmounted) on any exit.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import __version__, paths, runner, targets
from ..artifact import (
    LocalStore,
    Manifest,
    artifact_name,
    canonical_json,
    input_digest,
    pack,
    read_manifest,
    sha256_bytes,
    sha256_file,
)
from ..errors import ArtifactError, CommandError, InputError, NodeprepError
from ..log import step
from ..progress import Phases, Sink
from ..sources import drivers, runfile
from . import buildroot, cc, headers, hostbuild, kbuild, signing, smoke, userspace

log = logging.getLogger(__name__)

BUILD_FORMAT = 1  # bump when the build procedure changes its output
BUILDERS = ("chroot", "host", "podman", "docker")
AnyRoot = buildroot.BuildRoot | hostbuild.HostRoot


class BuildError(NodeprepError):
    """Compiling the modules failed; the hint carries the compiler's last error lines."""


@dataclass(frozen=True)
class BuildRequest:
    driver: str | None = None  # exact version, branch ("535") or None for the newest
    flavour: str = "proprietary"
    os_name: str = targets.DEFAULT
    kernel: str | None = None  # None: the OS's current default kernel
    arch: str = "amd64"
    store: Path = paths.DEFAULT_STORE
    cache: Path = field(default_factory=paths.default_cache)
    runfile: str | None = None  # URL/path of an NVIDIA .run installer instead of Debian's sources
    runfile_sha256: str | None = None
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


@dataclass(frozen=True)
class BuildResult:
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


# ---------------------------------------------------------------------------------------------
# Inputs


@dataclass(frozen=True)
class Plan:
    """Everything resolved about the inputs of one build (JSON-serialisable)."""

    driver_version: str
    flavour: str
    kernel_release: str
    source: dict[str, str]  # {"kind": "debian", "package", "version"} or {"kind": "runfile", "url", "name"}
    debs: dict[str, str]  # role ("source", "headers", ...) -> .deb path
    header_packages: list[list[str]]


@contextlib.contextmanager
def _timed(timings: dict[str, float], key: str, text: str | None = None) -> Iterator[None]:
    """Record how long the block took under `key` (and log it as a step when `text`)."""
    t = time.monotonic()
    with step(text) if text else contextlib.nullcontext():
        yield
    timings[key] = round(timings.get(key, 0.0) + time.monotonic() - t, 2)


def _archive(req: BuildRequest) -> Any:
    from ..sources.debian import DebianArchive

    # The archive of the target OS and the kernel's line; an OS that borrows another's driver
    # sources and user space gets that OS's archive (nodeprep.targets says which).
    kernel = targets.line_kernel(req.os_name, req.kernel, req.builder)
    return DebianArchive(req.cache, os_name=req.os_name, arch=req.arch, kernel=kernel)


class _LazyArchive:
    """The Debian archive, created on first use: a host build from a runfile never needs apt."""

    def __init__(self, req: BuildRequest) -> None:
        self._req = req
        self._real: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._real is None:
            self._real = _archive(self._req)
        return getattr(self._real, name)


def _lists_fingerprint(archive: Any) -> str | None:
    """Identity of the apt lists the archive answers from (None: unknown, do not memoise)."""
    lists = Path(getattr(archive, "dir", "")) / "lists"
    if not getattr(archive, "dir", None) or not lists.is_dir():
        return None
    entries = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in lists.iterdir() if p.is_file())
    return sha256_bytes(canonical_json(entries)) if entries else None


def _runfile_version(name: str, header: runfile.MakeselfHeader) -> str | None:
    for text in (name, header.label, header.targetdir):
        m = re.search(r"(\d{3}\.\d{2,3}(?:\.\d{2})?)", text or "")
        if m:
            return m[1]
    return None


def resolve_plan(
    req: BuildRequest, archive: Any, phases: Phases | None = None
) -> tuple[Plan, Path | None]:
    """Resolve and download every input. Returns the plan and the runfile path (if any).

    The answers for the Debian archive are memoised per apt lists state (same lists -> same answers)
    so a cache hit costs no apt queries."""
    archive.update()  # cheap while the lists are fresh; refreshed lists give new answers (and a new memo key)
    memo_key = sha256_bytes(
        canonical_json(
            {
                "driver": req.driver,
                "flavour": req.flavour,
                "os": req.os_name,
                "kernel": req.kernel,
                "arch": req.arch,
                "runfile": req.runfile,
                "sha256": req.runfile_sha256,
                "lists": _lists_fingerprint(archive),
            }
        )
    )
    memo = req.cache / "plans" / f"{memo_key}.json"
    run_path = _fetch_runfile(req, phases)
    if _lists_fingerprint(archive) and memo.is_file():
        plan = Plan(**json.loads(memo.read_text()))
        if all(Path(p).is_file() for p in plan.debs.values()):
            return plan, run_path
    version, source = _driver_source(req, archive, run_path)
    hdrs = headers.resolve(archive, req.kernel, arch=req.arch)
    wanted = ([("source", source["package"], source["version"])] if run_path is None else []) + [
        (pkg, pkg, ver) for pkg, ver in hdrs.packages
    ]
    fetched = archive.download_many(
        [(pkg, ver) for _, pkg, ver in wanted], phases.reporter("resolve", "bytes") if phases else None
    )
    debs = {role: str(path) for (role, _, _), path in zip(wanted, fetched, strict=True)}
    plan = Plan(
        driver_version=version,
        flavour=req.flavour,
        kernel_release=hdrs.release,
        source=source,
        debs=debs,
        header_packages=[list(p) for p in hdrs.packages],
    )
    if _lists_fingerprint(archive):
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(plan), sort_keys=True))
        os.replace(tmp, memo)
    return plan, run_path


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


def _driver_source(req: BuildRequest, archive: Any, run_path: Path | None) -> tuple[str, dict[str, str]]:
    """(driver version, source description) from the runfile or Debian's catalogue."""
    if run_path is not None:
        header = runfile.read_header(run_path)
        version = _runfile_version(run_path.name, header)
        if version is None:
            raise InputError(
                f"{run_path.name}: cannot tell the driver version (name it NVIDIA-Linux-<arch>-<version>.run)"
            )
        if req.driver and req.driver != version:
            raise InputError(f"--driver {req.driver} does not match the installer's version {version}")
        return version, {"kind": "runfile", "url": req.runfile or "", "name": run_path.name}
    kernel = targets.line_kernel(req.os_name, req.kernel, req.builder)
    chosen = drivers.resolve_for_target(archive, req.os_name, kernel, req.driver, req.flavour)
    return chosen.driver_version, {
        "kind": "debian",
        "package": chosen.package,
        "version": chosen.debian_version,
    }


def resolve_host_plan(
    req: BuildRequest, archive: Any, release: str, phases: Phases | None = None
) -> tuple[Plan, Path | None]:
    """`--builder host`: the headers are the system's (no packages); only the driver sources are
    resolved (the runfile, or Debian's kernel-source package, whose .deb is the one input file)."""
    run_path = _fetch_runfile(req, phases)
    if run_path is None:
        archive.update()
    version, source = _driver_source(req, archive, run_path)
    debs = (
        {}
        if run_path is not None
        else {"source": str(archive.download(source["package"], source["version"]))}
    )
    plan = Plan(
        driver_version=version,
        flavour=req.flavour,
        kernel_release=release,
        source=source,
        debs=debs,
        header_packages=[],
    )
    return plan, run_path


def build_params(req: BuildRequest, plan: Plan, root: AnyRoot) -> dict[str, Any]:
    """Everything besides the input files that decides the artifact's bytes."""
    return {
        "build_format": BUILD_FORMAT,
        "kind": "kmod",
        "driver_version": plan.driver_version,
        "flavour": plan.flavour,
        "kernel_release": plan.kernel_release,
        "os": req.os_name,
        "arch": req.arch,
        "build_root": {"key": root.spec.key, "packages": list(root.packages)},
        "source": {k: v for k, v in plan.source.items() if k != "url"},
        "signing": (
            {"cert_sha256": sha256_file(req.sign_cert), "hash": req.sign_hash} if req.sign_cert else None
        ),
        "smoke_test": bool(req.smoke_test),
        "allow_cc_mismatch": req.allow_cc_mismatch,
    }


# ---------------------------------------------------------------------------------------------
# Compiling


def tree_digest(tree: Path) -> str:
    """sha256 over every file of a source tree (relative path, mode bit, content)."""
    h = hashlib.sha256()
    for p in sorted(tree.rglob("*")):
        if p.is_dir() and not p.is_symlink():
            continue
        rel = p.relative_to(tree).as_posix()
        if p.is_symlink():
            h.update(f"L {rel} {os.readlink(p)}\n".encode())
        else:
            h.update(f"F {rel} {int(bool(p.stat().st_mode & 0o111))} {sha256_file(p)}\n".encode())
    return h.hexdigest()


def _find_module_tree(top: Path) -> Path:
    for kbuild_file in sorted(top.rglob("Kbuild")):
        d = kbuild_file.parent
        if (d / "nvidia").is_dir() and (d / "Makefile").is_file():
            return d
    raise InputError(f"{top}: no NVIDIA kernel module tree (Kbuild + nvidia/) in the sources")


def _place_sources(plan: Plan, run_path: Path | None, root: Path, scratch: Path) -> Path:
    """Put the kernel module tree at BUILD_DIR inside `root`; returns that path."""
    dest = root / kbuild.BUILD_DIR.lstrip("/")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if run_path is not None:
        subdir = "kernel-open" if plan.flavour == "open" else "kernel"
        return runfile.extract_tree(run_path, subdir, dest)
    pkg = scratch / "source-deb"
    runner.run(["dpkg-deb", "-x", plan.debs["source"], pkg])
    tarballs = sorted((pkg / "usr" / "src").glob("*.tar.xz"))
    if not tarballs:
        raise InputError(f"{Path(plan.debs['source']).name}: no /usr/src/*.tar.xz kernel sources")
    unpacked = scratch / "source"
    unpacked.mkdir()
    runner.run(["tar", "-xJf", tarballs[0], "-C", unpacked, "--no-same-owner"], timeout=600)
    shutil.move(_find_module_tree(unpacked), dest)
    return dest


def _error_lines(log_path: Path, limit: int = 12) -> str:
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [ln for ln in lines if re.search(r"\berror\b|Error \d+|undefined!", ln, re.I)]
    return "\n".join((errors or lines)[-limit:])


def compile_in_root(
    req: BuildRequest,
    plan: Plan,
    run_path: Path | None,
    root: AnyRoot,
    *,
    log_path: Path,
    phases: Phases | None = None,
    timings: dict[str, float] | None = None,
    cleanup: list[threading.Thread] | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Compile + strip in a clone of the build root (host: in a private work directory on this
    system). Returns (dir with stripped .ko, build info).

    The result is cached by compile key under <cache>/kmod-builds/ (unless --rebuild)."""
    timings = timings if timings is not None else {}
    phases = phases or Phases()
    what = f"Compiling {plan.flavour} {plan.driver_version} for {plan.kernel_release}"
    if isinstance(root, hostbuild.HostRoot):
        work = buildroot.private_dir(req.cache / "tmp", "build")
        try:
            with phases.phase("compile", what):
                return _compile_in_clone(
                    req, plan, run_path, root, work, log_path=log_path, phases=phases, timings=timings
                )
        finally:
            t = time.monotonic()
            buildroot.remove_tree(work)
            timings["cleanup"] = round(time.monotonic() - t, 2)
    with contextlib.ExitStack() as stack:
        with phases.phase("buildroot", "Kernel headers layer and a private clone of the build root"):
            with _timed(timings, "headers_layer"):
                layered = buildroot.with_headers(
                    root, [Path(plan.debs[p]) for p, _ in plan.header_packages], req.cache
                )
            with _timed(timings, "clone"):
                clone = stack.enter_context(buildroot.workspace(layered, req.cache / "tmp", cleanup=cleanup))
        with phases.phase("compile", what):
            result = _compile_in_clone(
                req, plan, run_path, root, clone, log_path=log_path, phases=phases, timings=timings
            )
        t = time.monotonic()
    timings["cleanup"] = round(time.monotonic() - t, 2)
    return result


def _compile_in_clone(
    req: BuildRequest,
    plan: Plan,
    run_path: Path | None,
    root: AnyRoot,
    clone: Path,
    *,
    log_path: Path,
    phases: Phases,
    timings: dict[str, float],
) -> tuple[Path, dict[str, Any]]:
    tmp_parent = req.cache / "tmp"
    scratch = Path(tempfile.mkdtemp(prefix="scratch.", dir=clone.parent))
    with _timed(timings, "prepare", "Placing the driver sources in the build root"):
        tree = _place_sources(plan, run_path, clone, scratch)
        shutil.rmtree(scratch, ignore_errors=True)
    host = root if isinstance(root, hostbuild.HostRoot) else None
    if host is not None:
        headers_dir = host.headers_dir
        kernel_cc = cc.read_kernel_compiler(headers_dir)
        build_cc = cc.Compiler(host.compiler)
        headers_key: dict[str, str] = {"host-headers": host.headers_sha256}
    else:
        headers_dir = clone / "usr" / "src" / f"linux-headers-{plan.kernel_release}"
        kernel_cc = cc.read_kernel_compiler(headers_dir)
        build_cc = cc.Compiler(
            kbuild.root_compiler_version(clone, kernel_cc.program) or f"{kernel_cc.program} (missing)"
        )
        headers_key = {
            Path(plan.debs[p]).name: sha256_file(Path(plan.debs[p])) for p, _ in plan.header_packages
        }
    problem = cc.mismatch(kernel_cc, build_cc)
    info: dict[str, Any] = {"compiler": kernel_cc.text, "build_compiler": build_cc.text}
    if problem and not req.allow_cc_mismatch:
        raise InputError(
            f"compiler mismatch: {problem}",
            hint="use the build root of the kernel's OS, or --allow-cc-mismatch to build anyway",
        )
    if problem:
        log.warning("warning: %s (--allow-cc-mismatch)", problem)
        info["cc_mismatch"] = problem
    with _timed(timings, "tree_digest"):
        tree_sha = tree_digest(tree)
    compile_key = sha256_bytes(
        canonical_json(
            {
                "format": BUILD_FORMAT,
                "tree": tree_sha,
                "flavour": plan.flavour,
                "headers": headers_key,
                "build_root": list(root.packages),
                "kernel_release": plan.kernel_release,
            }
        )
    )
    info["compile_key"] = compile_key
    kept = req.cache / "kmod-builds" / compile_key
    if not req.rebuild and (kept / "modules.json").is_file():
        log.info("Reusing modules compiled earlier from an identical source tree (%s…)", compile_key[:12])
        info["compiled"] = False
        return kept, info
    jobs = req.jobs or os.cpu_count() or 1
    counter = kbuild.CompileProgress(kbuild.count_objects(tree), phases.reporter("compile", "objects"))
    counter.start()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with _timed(
        timings,
        "make",
        f"Compiling {plan.flavour} {plan.driver_version} for {plan.kernel_release} (-j{jobs})",
    ):
        try:
            built = kbuild.compile_modules(
                None if host else clone,
                plan.kernel_release,
                jobs=jobs,
                log_path=log_path,
                on_line=counter,
                tree=str(tree) if host else kbuild.BUILD_DIR,
                extra=hostbuild.make_vars(host, tree) if host else (),
            )
        except CommandError as e:
            if e.returncode == 127 or "timed out" in str(e):
                raise BuildError(f"compiling the modules failed: {e.message}") from None
            raise BuildError(
                f"compiling the modules failed (make exit {e.returncode}); full log: {log_path}",
                hint=_error_lines(log_path),
            ) from None
    if "nvidia.ko" not in {p.name for p in built}:
        raise BuildError(
            f"the build produced no nvidia.ko; full log: {log_path}", hint=_error_lines(log_path)
        )
    with _timed(timings, "strip"):
        if host:
            kbuild.strip_modules(None, [p.name for p in built], tree=str(tree))
        else:
            kbuild.strip_modules(clone, [p.name for p in built])
    staging = buildroot.private_dir(tmp_parent, "modules")
    try:
        for p in built:
            shutil.copyfile(p, staging / p.name)
            os.chmod(staging / p.name, 0o644)
        (staging / "modules.json").write_text(
            json.dumps({"modules": [p.name for p in built], "compiler": kernel_cc.text}, sort_keys=True)
        )
        kept.parent.mkdir(parents=True, exist_ok=True)
        if kept.exists():
            shutil.rmtree(kept)
        os.replace(staging, kept)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    info["compiled"] = True
    return kept, info


# ---------------------------------------------------------------------------------------------
# The whole build


def _store_hit(store: LocalStore, name: str, digest: str) -> Path | None:
    try:
        entry = store.lookup(name)
    except InputError:
        return None
    path = store.path / name
    if entry and entry.input_digest == digest and path.is_file() and sha256_file(path) == entry.sha256:
        return path
    return None


def _current_userspace(path: Path) -> bool:
    """A published user-space artifact is reused only when this nodeprep would make it the same way
    (a layout or compression change rebuilds it from the cached packages)."""
    from .userspace import is_current

    try:
        return is_current(read_manifest(path))
    except ArtifactError:
        return False


def _userspace(
    req: BuildRequest,
    archive: Any,
    store: LocalStore,
    driver_version: str,
    notes: list[str],
    phases: Phases | None = None,
) -> Path | None:
    name = artifact_name("userspace", driver_version, arch=req.arch)
    if not req.rebuild:
        try:
            entry = store.lookup(name)
        except InputError:
            entry = None
        if entry and (store.path / name).is_file() and _current_userspace(store.path / name):
            return store.path / name
    # User space is distribution-independent: host builds for any OS take it from Debian's archive
    # when Debian serves that driver version; where Debian (or apt) is out of reach, it is skipped.
    soft: tuple[type[Exception], ...] = (
        (NodeprepError,)
        if req.builder == "host" and targets.get(req.os_name).borrows_sources
        else (InputError,)
    )
    phases = phases or Phases()
    text = f"Building the user-space artifact for {driver_version}"
    with step(text), phases.phase("userspace", text):
        try:
            path, manifest = userspace.build_userspace(
                archive,
                driver_version,
                req.cache / "userspace",
                arch=req.arch,
                progress=phases.reporter("userspace", "bytes"),
            )
        except soft as e:
            notes.append(f"user-space artifact skipped: {e}")
            log.warning("warning: user-space artifact skipped: %s", e)
            return None
        store.publish(Path(path), manifest)
    return store.path / name


def validate_request(req: BuildRequest) -> None:
    """Refuse bad input before anything is downloaded or written (InputError, exit 2)."""
    target = targets.get(req.os_name)
    if req.builder == "host":
        if req.smoke_test and not target.smoke_boot:
            raise InputError(
                f"--smoke-test: boots Debian kernels only, not {req.os_name} (use --no-smoke-test)"
            )
    else:
        buildroot.spec_for(req.os_name, req.kernel)
        targets.channel(target, req.kernel)
        if req.headers_dir is not None:
            raise InputError("--headers-dir is only used with --builder host")
    if req.flavour not in drivers.FLAVOURS:
        raise InputError(f"--flavour: {req.flavour!r} is not one of {', '.join(drivers.FLAVOURS)}")
    if req.driver is not None and not drivers.DRIVER_RE.match(req.driver):
        raise InputError(
            f"--driver: {req.driver!r} is not a driver version (like 535.309.01) or branch (535)"
        )
    if req.runfile and not req.runfile_sha256:
        raise InputError("--runfile needs --sha256 (the installer's published sha256)")
    if req.runfile_sha256 and not re.fullmatch(r"[0-9a-fA-F]{64}", req.runfile_sha256):
        raise InputError(f"--sha256: {req.runfile_sha256!r} is not a sha256 hex digest (64 hex digits)")
    if req.sign_key or req.sign_cert:
        if not (req.sign_key and req.sign_cert):
            raise InputError("--sign-key and --sign-cert go together")
        for what, p in (("--sign-key", req.sign_key), ("--sign-cert", req.sign_cert)):
            if not (what == "--sign-key" and str(p).startswith("pkcs11:")) and not Path(p).is_file():
                raise InputError(f"{what}: {p} does not exist")
        if req.sign_hash not in ("sha256", "sha384", "sha512"):
            raise InputError(f"--sign-hash: {req.sign_hash!r} is not one of sha256, sha384, sha512")


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


def _prebuild_userspace(
    req: BuildRequest,
    archive: Any,
    store: LocalStore,
    driver_version: str,
    phases: Phases,
    background: list[threading.Thread],
) -> None:
    """Make the user-space artifact in the cache in a thread (not published: `_userspace` does that
    at the end, then finding it ready by its input digest). Errors are left to that final call."""
    published = store.path / artifact_name("userspace", driver_version, arch=req.arch)
    if not req.userspace or (published.exists() and _current_userspace(published)):
        return

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


def _build_driver(
    req: BuildRequest, archive: Any, phases: Phases, background: list[threading.Thread], start: float
) -> BuildResult:
    store = LocalStore(req.store)
    validate_request(req)
    host = req.builder == "host"
    archive = archive or (_LazyArchive(req) if host else _archive(req))
    # The smoke test boots Debian's kernel: off by default for host builds for other OSes.
    smoke_default = targets.get(req.os_name).smoke_boot
    smoke_on = req.smoke_test if req.smoke_test is not None else smoke_default
    req = replace(req, smoke_test=smoke_on)

    buildroot.sweep_stale(req.cache / "tmp")
    root: AnyRoot
    if host:
        root, release = hostbuild.host_root(req.os_name, req.kernel, req.headers_dir)
        with phases.phase("resolve", "Resolving and downloading the inputs"):
            plan, run_path = resolve_host_plan(req, archive, release, phases)
    else:
        with phases.phase("resolve", "Resolving and downloading the inputs"):
            plan, run_path = resolve_plan(req, archive, phases)
        spec = buildroot.spec_for(req.os_name, req.kernel)
        if not buildroot.cached(spec, req.cache):
            # mmdebstrap is mostly one dpkg on one core: the user-space artifact is made meanwhile.
            _prebuild_userspace(req, archive, store, plan.driver_version, phases, background)
        with phases.phase("buildroot", f"Build root for {req.os_name}"):
            root = buildroot.ensure(
                spec,
                req.cache,
                mirror=archive.mirror,
                security_mirror=getattr(archive, "security_mirror", None),
            )
    inputs = {Path(p).name: sha256_file(Path(p)) for p in plan.debs.values()}
    if run_path is not None:
        inputs[run_path.name] = sha256_file(run_path)
    params = build_params(req, plan, root)
    digest = input_digest(inputs, params)
    name = artifact_name(
        "kmod", plan.driver_version, flavour=plan.flavour, kernel_release=plan.kernel_release
    )
    notes: list[str] = []
    log_path = req.cache / "logs" / f"{name.removesuffix('.tar.zst')}.log"

    hit = None if req.rebuild else _store_hit(store, name, digest)
    if hit is not None:
        from ..artifact import read_manifest

        log.info("%s is up to date in %s (input digest %s…): nothing to build", name, store.path, digest[:12])
        for thread in background:
            thread.join()
        us = _userspace(req, archive, store, plan.driver_version, notes, phases) if req.userspace else None
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
        return _build_and_publish(
            req,
            plan,
            run_path,
            root,
            archive,
            store,
            inputs,
            digest,
            name,
            log_path=log_path,
            phases=phases,
            timings=timings,
            cleanup=cleanup,
            start=start,
            background=background,
        )
    finally:
        with _timed(timings, "cleanup_wait"):
            for thread in cleanup:
                thread.join()


def _build_and_publish(
    req: BuildRequest,
    plan: Plan,
    run_path: Path | None,
    root: AnyRoot,
    archive: Any,
    store: LocalStore,
    inputs: dict[str, str],
    digest: str,
    name: str,
    *,
    log_path: Path,
    phases: Phases,
    timings: dict[str, float],
    cleanup: list[threading.Thread],
    start: float,
    background: list[threading.Thread],
) -> BuildResult:
    smoke_on = bool(req.smoke_test)
    notes: list[str] = []
    modules_dir, info = compile_in_root(
        req, plan, run_path, root, log_path=log_path, phases=phases, timings=timings, cleanup=cleanup
    )
    tmp_parent = req.cache / "tmp"
    tmp_parent.mkdir(parents=True, exist_ok=True)
    work = buildroot.private_dir(tmp_parent, "pack")
    try:
        payload = work / "payload"
        mod_dir = payload / "modules" / plan.kernel_release
        mod_dir.mkdir(parents=True)
        for ko in json.loads((modules_dir / "modules.json").read_text())["modules"]:
            shutil.copyfile(modules_dir / ko, mod_dir / ko)
            os.chmod(mod_dir / ko, 0o644)
        vermagic = kbuild.modinfo(mod_dir / "nvidia.ko", "vermagic")
        extra: dict[str, Any] = {
            "source": {k: v for k, v in plan.source.items() if k != "url"}
            | ({"sha256": inputs[run_path.name]} if run_path else {}),
            "kernel_headers": (
                {"dir": str(root.headers_dir), "sha256": root.headers_sha256}
                if isinstance(root, hostbuild.HostRoot)
                else {p: v for p, v in plan.header_packages}
            ),
            "build_root": {
                "os": req.os_name,
                "key": root.spec.key,
                "packages_sha256": root.packages_sha256,
                "packages": list(root.packages),
            },
            "build": {
                "format": BUILD_FORMAT,
                "compile_key": info["compile_key"],
                "build_compiler": info["build_compiler"],
                "path": kbuild.BUILD_DIR,
                **({"cc_mismatch": info["cc_mismatch"]} if "cc_mismatch" in info else {}),
            },
        }
        if req.sign_key and req.sign_cert:
            with _timed(timings, "sign", "Signing the modules"), _headers_tree(req, plan, root) as hdir:
                extra["signing"] = signing.sign_modules(
                    mod_dir, hdir, Path(req.sign_key), Path(req.sign_cert), req.sign_hash
                )
        if smoke_on:
            text = f"Smoke-testing the modules on {plan.kernel_release}"
            with _timed(timings, "smoke_test", text), phases.phase("smoke_test", text):
                result = smoke.smoke_test_modules(
                    mod_dir,
                    plan.kernel_release,
                    archive=archive,
                    cache=req.cache,
                    # Signed modules boot under UEFI Secure Boot with the signing certificate
                    # enrolled, as on a node that enrolled it: they must load under lockdown.
                    trusted_cert=Path(req.sign_cert) if req.sign_key and req.sign_cert else None,
                )
            extra["smoke_test"] = result.to_dict()
            if not result.passed:
                raise BuildError(
                    f"smoke test failed on {plan.kernel_release}: "
                    f"{getattr(result, 'reason', 'see the log')}; not publishing "
                    "(--no-smoke-test skips it)",
                    hint=getattr(result, "log_excerpt", None) or None,
                )
        manifest = Manifest(
            kind="kmod",
            driver_version=plan.driver_version,
            arch=req.arch,
            os=req.os_name,
            input_digest=digest,
            inputs=inputs,
            flavour=plan.flavour,
            kernel_release=plan.kernel_release,
            vermagic=vermagic,
            compiler=info["compiler"],
            extra=extra,
            nodeprep_version=__version__,
        )
        with phases.phase("pack", f"Packing {name}"):
            with _timed(timings, "pack", f"Packing {name}"):
                path, manifest = pack(payload, manifest, work / "out")
            with _timed(timings, "publish"):
                store.publish(path, manifest)
    finally:
        buildroot.remove_tree(work)
    for thread in background:
        thread.join()
    us = _userspace(req, archive, store, plan.driver_version, notes, phases) if req.userspace else None
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


class _headers_tree:
    """Context manager: the arch-specific headers of `plan` extracted in a temporary root
    (the signing hook needs scripts/sign-file and the kernel's certs there)."""

    def __init__(self, req: BuildRequest, plan: Plan, root: AnyRoot) -> None:
        self.req, self.plan, self.root = req, plan, root
        self.tmp: Path | None = None

    def __enter__(self) -> Path:
        if isinstance(self.root, hostbuild.HostRoot):
            return self.root.headers_dir  # the system's own headers (scripts/sign-file, certs)
        self.tmp = buildroot.private_dir(self.req.cache / "tmp", "headers")
        for deb in [self.plan.debs[p] for p, _ in self.plan.header_packages]:
            runner.run(["dpkg-deb", "-x", deb, self.tmp])
        return self.tmp / "usr" / "src" / f"linux-headers-{self.plan.kernel_release}"

    def __exit__(self, *exc: object) -> None:
        if self.tmp is not None:
            buildroot.remove_tree(self.tmp)
