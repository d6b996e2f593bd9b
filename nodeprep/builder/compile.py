"""Compiling one build's resolved inputs: the driver sources placed in a build root clone, kbuild,
strip, and the compile cache.

    place_sources -> compiler check -> compile key -> kept in <cache>/kmod-builds/<key>? reuse.
    otherwise: kbuild (error lines into BuildError's hint) -> strip -> keep under the compile key.

The compile key digests the source tree itself (`tree_digest`), the headers and the build root's
packages, so an installer whose kernel tree is byte-identical to Debian's reuses the compiled
(stripped, unsigned) modules. The clone or work directory is removed on any exit.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import runner
from ..digests import canonical_json, sha256_bytes, sha256_file
from ..errors import BuildError, CommandError, InputError
from ..log import timed
from ..progress import Phases
from ..sources import opensource, runfile
from . import buildroot, cc, companionbuild, hostbuild, kbuild
from .resolve import BUILD_FORMAT, AnyBuildRoot, BuildRequest, ResolvedInputs

log = logging.getLogger(__name__)


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


def output_dir(resolved: ResolvedInputs) -> str:
    """Where `make modules` leaves the .ko, relative to the placed tree ('' : the tree itself)."""
    return opensource.OUTPUT_DIR if resolved.source.get("kind") == "open-source" else ""


def place_sources(resolved: ResolvedInputs, src_file: Path | None, clone: Path, scratch: Path) -> Path:
    """Put the kernel module tree (an open-source release: its whole top directory, whose Makefile
    builds src/ and then kernel-open/) at BUILD_DIR inside `clone` (a clone of the build root, or the
    host build's work directory); returns that path."""
    dest = clone / kbuild.BUILD_DIR.lstrip("/")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src_file is not None and resolved.source.get("kind") == "open-source":
        return opensource.extract_tree(src_file, dest)
    if src_file is not None:
        subdir = "kernel-open" if resolved.flavour == "open" else "kernel"
        return runfile.extract_tree(src_file, subdir, dest)
    pkg = scratch / "source-deb"
    runner.run(["dpkg-deb", "-x", resolved.debs["source"], pkg])
    tarballs = sorted((pkg / "usr" / "src").glob("*.tar.xz"))
    if not tarballs:
        raise InputError(f"{Path(resolved.debs['source']).name}: no /usr/src/*.tar.xz kernel sources")
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
    resolved: ResolvedInputs,
    src_file: Path | None,
    build_root: AnyBuildRoot,
    *,
    log_path: Path,
    phases: Phases | None = None,
    timings: dict[str, float] | None = None,
    cleanup: list[threading.Thread] | None = None,
    companion_files: Mapping[str, Path] | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Compile + strip in a clone of the build root (host: in a private work directory on this
    system). Returns (dir with stripped .ko, build info).

    The result is cached by compile key under <cache>/kmod-builds/ (unless --rebuild).
    `companion_files` (name -> tarball, builder/companionbuild.py) are compiled next in the same clone,
    against the driver's tree and nvidia.ko; their directory and facts are in info["companions"]."""
    timings = timings if timings is not None else {}
    phases = phases or Phases()
    what = f"Compiling {resolved.flavour} {resolved.driver_version} for {resolved.kernel_release}"
    if isinstance(build_root, hostbuild.HostRoot):
        work = buildroot.private_dir(req.cache / "tmp", "build")
        try:
            with phases.phase("compile", what):
                return _compile_in_clone(
                    req, resolved, src_file, build_root, work, log_path=log_path, phases=phases,
                    timings=timings,
                )
        finally:
            t = time.monotonic()
            buildroot.remove_tree(work)
            timings["cleanup"] = round(time.monotonic() - t, 2)
    with contextlib.ExitStack() as stack:
        with phases.phase("buildroot", "Kernel headers layer and a private clone of the build root"):
            with timed(timings, "headers_layer"):
                layered = buildroot.with_headers(
                    build_root, [Path(resolved.debs[p]) for p, _ in resolved.header_packages], req.cache
                )
            with timed(timings, "clone"):
                clone = stack.enter_context(buildroot.workspace(layered, req.cache / "tmp", cleanup=cleanup))
        with phases.phase("compile", what):
            result = _compile_in_clone(
                req, resolved, src_file, build_root, clone, log_path=log_path, phases=phases, timings=timings
            )
        if companion_files:
            names = ", ".join(sorted(companion_files))
            with phases.phase("compile", f"Compiling {names} against {resolved.driver_version}"):
                kept, cinfo = companionbuild.compile_companions(
                    companion_files, clone=clone, tree=clone / kbuild.BUILD_DIR.lstrip("/"),
                    driver_dir=result[0], driver_key=result[1]["compile_key"],
                    kernel_release=resolved.kernel_release, flavour=resolved.flavour,
                    build_root=list(build_root.packages),
                    cache=req.cache, jobs=req.jobs or os.cpu_count() or 1,
                    log_dir=log_path.parent / f"{log_path.name.removesuffix('.log')}.companions",
                    rebuild=req.rebuild, timings=timings,
                )
            result[1]["companions"] = {"dir": str(kept), **cinfo}
        t = time.monotonic()
    timings["cleanup"] = round(time.monotonic() - t, 2)
    return result


def _compile_in_clone(
    req: BuildRequest,
    resolved: ResolvedInputs,
    src_file: Path | None,
    build_root: AnyBuildRoot,
    clone: Path,
    *,
    log_path: Path,
    phases: Phases,
    timings: dict[str, float],
) -> tuple[Path, dict[str, Any]]:
    tmp_parent = req.cache / "tmp"
    scratch = Path(tempfile.mkdtemp(prefix="scratch.", dir=clone.parent))
    with timed(timings, "prepare", "Placing the driver sources in the build root"):
        tree = place_sources(resolved, src_file, clone, scratch)
        shutil.rmtree(scratch, ignore_errors=True)
    host = build_root if isinstance(build_root, hostbuild.HostRoot) else None
    if host is not None:
        headers_dir = host.headers_dir
        kernel_cc = cc.read_kernel_compiler(headers_dir)
        build_cc = cc.Compiler(host.compiler)
        headers_key: dict[str, str] = {"host-headers": host.headers_sha256}
    else:
        headers_dir = clone / "usr" / "src" / f"linux-headers-{resolved.kernel_release}"
        kernel_cc = cc.read_kernel_compiler(headers_dir)
        build_cc = cc.Compiler(
            kbuild.root_compiler_version(clone, kernel_cc.program) or f"{kernel_cc.program} (missing)"
        )
        headers_key = {
            Path(resolved.debs[p]).name: sha256_file(Path(resolved.debs[p]))
            for p, _ in resolved.header_packages
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
    with timed(timings, "tree_digest"):
        tree_sha = tree_digest(tree)
    compile_key = sha256_bytes(
        canonical_json(
            {
                "format": BUILD_FORMAT,
                "tree": tree_sha,
                "flavour": resolved.flavour,
                "headers": headers_key,
                "build_root": list(build_root.packages),
                "kernel_release": resolved.kernel_release,
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
    out = output_dir(resolved)
    counter = kbuild.CompileProgress(kbuild.count_objects(tree), phases.reporter("compile", "objects"))
    counter.start()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with timed(
        timings,
        "make",
        f"Compiling {resolved.flavour} {resolved.driver_version} for {resolved.kernel_release} (-j{jobs})",
    ):
        try:
            built = kbuild.compile_modules(
                None if host else clone,
                resolved.kernel_release,
                jobs=jobs,
                log_path=log_path,
                on_line=counter,
                tree=str(tree) if host else kbuild.BUILD_DIR,
                extra=hostbuild.make_vars(host, tree) if host else (),
                out=out,
                cc=kernel_cc.program if out and not host else None,  # host: make_vars has CC=
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
    with timed(timings, "strip"):
        names = [f"{out}/{p.name}" if out else p.name for p in built]
        if host:
            kbuild.strip_modules(None, names, tree=str(tree))
        else:
            kbuild.strip_modules(clone, names)
    buildroot.keep_modules(built, kept, tmp_parent, compiler=kernel_cc.text)
    info["compiled"] = True
    return kept, info
