"""Build-side commands (see nodeprep/cli.py): build-driver, build-matrix, artifacts list|verify.

Thin: parse options, call nodeprep.builder.driver / resolve / matrix / publish / the store, render."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from .. import artifact, log, targets
from ..builder import containerbuild, hostbuild, matrix, parallel, publish
from ..builder.driver import build_driver
from ..builder.resolve import BuildRequest, LazyArchive, open_archive, preview, validate_request
from ..errors import InputError, NodeprepError
from ..paths import DEFAULT_STORE, default_cache
from ..stores.store import Store
from ..stores.storecheck import check_store
from ..vocab import DEFAULT_FLAVOUR, FLAVOURS
from . import progressview as render
from .clioptions import check_option, emit_json, json_option, path_option, registry_options, store_options

if TYPE_CHECKING:
    from ..builder.driver import BuildResult
    from ..progress import Sink

DEFAULT_CACHE = default_cache()

store_option = click.option(
    "--store",
    default=str(DEFAULT_STORE),
    show_default=True,
    metavar="DIR|oci://HOST[:PORT]/REPO",
    help="Store the artifacts are published to: a directory, or an OCI registry repository (built "
    "into <cache>/oci-publish/ first, then pushed with a merged index).",
)
cache_option = click.option(
    "--cache",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_CACHE,
    show_default=True,
    help="Downloads, build roots and compiled modules (reused; shared by every command, "
    "$NODEPREP_CACHE).",
)


@contextlib.contextmanager
def _progress_renderer() -> Iterator[Sink | None]:
    """The progress sink for build-driver: a self-rewriting line on a terminal, a line at least
    every 30 s otherwise (logs); none with -q."""
    if not logging.getLogger("nodeprep").isEnabledFor(logging.INFO):
        yield None
        return
    if log.interactive():
        term = render.TerminalRenderer(sys.stderr)
        try:
            yield term
        finally:
            term.end()
        return
    lines = render.LineRenderer(sys.stderr)
    with render.ticker(lines.tick):
        yield lines


def _push(location: str, staging: Path, names: list[str] | None, options: Any, as_json: bool) -> str:
    """Push `names` (default: everything) of the staging store to the registry; one summary line."""
    digest, count = publish.push(location, staging, names, options)
    if not as_json:
        click.echo(f"pushed {count} artifacts to {location}; index {digest}", err=True)
    return digest


def _container_to_registry(builder: str, req: Any, registry: str, options: Any, as_json: bool) -> int:
    """build-driver --builder podman|docker --store oci://... (publish.container_to_registry),
    rendered; returns the container's exit code."""
    res, pushed = publish.container_to_registry(builder, req, registry, options, capture=as_json)
    if as_json:
        sys.stderr.write(res.stderr)
    if pushed is None:
        sys.stdout.write(res.stdout)
        return int(res.returncode)
    digest, count = pushed
    if not as_json:
        click.echo(f"pushed {count} artifacts to {registry}; index {digest}", err=True)
        return 0
    try:
        emit_json({**json.loads(res.stdout), "pushed_index": digest})
    except ValueError:
        raise NodeprepError(f"--builder {builder}: the build in the container printed no JSON "
                            "result") from None
    return 0


def next_steps(result: BuildResult, *, store: Path | str, cache: Path) -> list[str]:
    """What to run after a build, with this build's arguments: smoke test, install on a node (a
    throwaway root first), cloud-init user-data. `store` is a directory or an oci:// location."""
    m = result.manifest
    store_abs = store if isinstance(store, str) else store.resolve()
    cache_arg = [] if cache == DEFAULT_CACHE else ["--cache", str(cache)]
    smoke = ["nodeprep", "smoke-test", str(result.artifact), *cache_arg]
    install = [
        "nodeprep", "install", "--store", str(store_abs), "--driver", m.driver_version,
        "--flavour", m.flavour or "proprietary", "--kernel", m.kernel_release or "",
    ]
    verdict = (m.extra.get("smoke_test") or {}).get("verdict")
    lines = ["next steps:"]
    lines.append(
        f"  smoke test (qemu boot of {m.kernel_release}"
        + (f"; {verdict} during this build" if verdict else "")
        + f"):  {shlex.join(smoke)}"
    )
    throwaway = [*install, "--root", "/tmp/nodeprep-root", "--no-load"]
    lines.append("  try it in a throwaway root (mkdir -p /tmp/nodeprep-root first):  "
                 f"{shlex.join(throwaway)}")
    lines.append(f"  install on a node (as root):  {shlex.join([*install, '--activate'])}")
    serve, url = (("", store_abs) if isinstance(store, str)
                  else (f"serve {store_abs} over http(s), ", "<its URL>"))
    lines.append(
        f"  cloud nodes:  {serve}set driver.version {m.driver_version}, driver.flavour {m.flavour}, "
        f"driver.kernel {m.kernel_release} and driver.store {url} in node.yaml, then:  "
        "nodeprep cloud-init --profile node.yaml --out user-data"
    )
    return lines


def _preview(req: Any, in_container: bool, as_json: bool) -> None:
    """build-driver --check: builder.resolve.preview, rendered (the host's headers only for a host build
    here; a container's host build names its kernel)."""
    release = None
    if req.builder == "host":
        if in_container and req.kernel is None:
            raise InputError("--check: a host build in a container needs --kernel (this machine's "
                             "headers are not the container's)")
        release = req.kernel if in_container else hostbuild.host_root(req.target, req.kernel,
                                                                      req.headers_dir)[1]
    archive = LazyArchive(req, read_only=True) if req.builder == "host" else open_archive(req, read_only=True)
    result = preview(req, archive, release)
    if as_json:
        emit_json(result)
        return
    driver = result["driver_version"] or "from the source file"
    click.echo(f"would build {result['artifact']} (driver {driver}, kernel {result['kernel_release']}, "
               f"{result['os']}, builder {result['builder']})")
    click.echo(f"  source: {' '.join(f'{k}={v}' for k, v in result['source'].items())}")
    click.echo(f"  would fetch: {', '.join(result['would_fetch'])}")
    if "build_root" in result:
        root = result["build_root"]
        click.echo(f"  build root {root['key'][:16]}…: {'cached' if root['cached'] else 'would be made'}")
    there = "there (a build reuses it when its input digest matches)" if result["in_store"] else "not there"
    click.echo(f"  store {result['store']}: {there}")
    if result["userspace"]:
        click.echo(f"  user space: {result['userspace']}")
    click.echo("nothing changed (--check)", err=True)


@click.command("build-driver")
@click.option(
    "--driver",
    default=None,
    metavar="VERSION",
    help="Driver version (535.309.01) or branch (535). Default: the newest Debian serves.",
)
@click.option(
    "--flavour", type=click.Choice(FLAVOURS), default=DEFAULT_FLAVOUR, show_default=True
)
@click.option("--os", "os_name", default=targets.DEFAULT, show_default=True,
              help="Target OS of the kernel (" + ", ".join(targets.names()) + ").")
@click.option(
    "--kernel",
    default=None,
    metavar="RELEASE",
    help="Kernel release (6.1.0-56-amd64). Default: the OS's current default kernel.",
)
@click.option("--arch", default="amd64", show_default=True, hidden=True)
@store_option
@cache_option
@click.option(
    "--runfile",
    default=None,
    metavar="URL",
    help="Build from an NVIDIA .run installer (http(s)://, file:// or a path) instead of Debian's sources.",
)
@click.option(
    "--sha256", "runfile_sha256", default=None, metavar="HEX", help="sha256 of --runfile (required with it)."
)
@click.option(
    "--open-source",
    default=None,
    metavar="URL",
    help="Build the open flavour from an NVIDIA open-gpu-kernel-modules release tarball (http(s)://, "
    "file:// or a path) instead of Debian's sources; with --runfile, that runfile (the user space's) "
    "must be the same version.",
)
@click.option(
    "--open-source-sha256", default=None, metavar="HEX", help="sha256 of --open-source (required with it)."
)
@click.option(
    "--persistenced-source",
    default=None,
    metavar="URL",
    help="Build nvidia-persistenced from this `git archive` of NVIDIA's nvidia-persistenced tag "
    "(nvidia-persistenced-<driver>.tar.gz; http(s)://, file:// or a path) at the driver's exact version "
    "into the user-space artifact, instead of Debian's separately versioned binary.",
)
@click.option(
    "--persistenced-sha256", default=None, metavar="HEX",
    help="sha256 of --persistenced-source (required with it).",
)
@click.option(
    "--fabricmanager",
    default=None,
    metavar="URL",
    help="NVIDIA's fabricmanager-linux-<arch>-<driver>-archive.tar.xz (http(s)://, file:// or a path): "
    "Fabric Manager at the driver's exact version into the user-space artifact (another version is "
    "refused).",
)
@click.option(
    "--fabricmanager-sha256", default=None, metavar="HEX",
    help="sha256 of --fabricmanager (required with it).",
)
@click.option(
    "--nvidia-fs",
    default=None,
    metavar="URL",
    help="Also build nvidia-fs (GPUDirect Storage) from this gds-nvidia-fs-<version>.tar.gz release "
    "(http(s)://, file:// or a path) against the driver's tree, into the same kmod artifact.",
)
@click.option(
    "--nvidia-fs-sha256", default=None, metavar="HEX", help="sha256 of --nvidia-fs (required with it)."
)
@click.option(
    "--gdrcopy",
    default=None,
    metavar="URL",
    help="Also build gdrdrv (GPUDirect RDMA copies) from this gdrcopy-<version>.tar.gz release "
    "(http(s)://, file:// or a path) against the driver's tree, into the same kmod artifact.",
)
@click.option("--gdrcopy-sha256", default=None, metavar="HEX", help="sha256 of --gdrcopy (required with it).")
@click.option(
    "--driver-suite",
    default=None,
    metavar="SUITE",
    help="Take the driver sources and user space from this Debian suite of the OS (experimental) "
    "instead of the kernel line's; needs --kernel.",
)
@click.option(
    "-j", "--jobs", type=click.IntRange(min=1), default=None, help="Parallel compile jobs (default: CPUs)."
)
@click.option(
    "--rebuild", is_flag=True, help="Compile even when the store or the cache already has the result."
)
@click.option(
    "--allow-cc-mismatch",
    is_flag=True,
    help="Build even if the build root's compiler differs from the kernel's.",
)
@click.option(
    "--userspace/--no-userspace",
    default=True,
    show_default=True,
    help="Also publish the user-space artifact of the driver.",
)
@click.option(
    "--builder",
    type=click.Choice(["chroot", "host", "podman", "docker"]),
    default="chroot",
    show_default=True,
    help="chroot: mmdebstrap build root of the target OS (debian-12, debian-13); host: this system's "
    "installed kernel headers and gcc; podman/docker: inside images/<os>/ (chroot for the Debian "
    "targets, host for the others).",
)
@path_option("--headers-dir", directory=True,
             help="--builder host: the kernel headers tree (default: /lib/modules/<kernel>/build, "
             "/usr/src/linux-headers-<kernel>, /usr/src/kernels/<kernel>).")
@path_option("--sign-key", help="Private key to sign the modules with (with --sign-cert).")
@path_option("--sign-cert", help="X.509 certificate matching --sign-key.")
@click.option("--sign-hash", type=click.Choice(["sha256", "sha512"]), default="sha256", show_default=True)
@click.option(
    "--smoke-test/--no-smoke-test",
    default=None,
    help="Boot the kernel in qemu and load the modules before publishing (default: on when available).",
)
@check_option("Print what would be fetched and built (the resolved inputs, the artifact's name) from "
              "the archive's package index; nothing is downloaded, built or written.")
@registry_options
@json_option
def build_driver_cmd(
    driver: str | None,
    flavour: str,
    os_name: str,
    kernel: str | None,
    arch: str,
    store: str,
    cache: Path,
    runfile: str | None,
    runfile_sha256: str | None,
    open_source: str | None,
    open_source_sha256: str | None,
    persistenced_source: str | None,
    persistenced_sha256: str | None,
    fabricmanager: str | None,
    fabricmanager_sha256: str | None,
    nvidia_fs: str | None,
    nvidia_fs_sha256: str | None,
    gdrcopy: str | None,
    gdrcopy_sha256: str | None,
    driver_suite: str | None,
    jobs: int | None,
    rebuild: bool,
    allow_cc_mismatch: bool,
    userspace: bool,
    builder: str,
    headers_dir: Path | None,
    sign_key: Path | None,
    sign_cert: Path | None,
    sign_hash: str,
    smoke_test: bool | None,
    registry_auth: str | None,
    ca_file: str | None,
    insecure_http: bool,
    check: bool,
    as_json: bool,
) -> None:
    """Build the NVIDIA kernel modules for one kernel release into the store.

    With no arguments: the newest driver Debian 12 serves (proprietary) for Debian 12's current
    kernel, into ./artifacts. Same inputs -> no compile, the same bytes (`"cached": true`).
    """
    if runfile_sha256 and not runfile:
        raise InputError("--sha256 is only used with --runfile")
    if open_source_sha256 and not open_source:
        raise InputError("--open-source-sha256 is only used with --open-source")
    if open_source and click.get_current_context().get_parameter_source("flavour") is ParameterSource.DEFAULT:
        flavour = "open"  # a release of the open kernel modules: the open flavour unless told otherwise
    if headers_dir is not None and builder != "host":
        raise InputError("--headers-dir is only used with --builder host")
    companions = []
    for name, option, url, sha in (("nvidia-fs", "--nvidia-fs", nvidia_fs, nvidia_fs_sha256),
                                   ("gdrdrv", "--gdrcopy", gdrcopy, gdrcopy_sha256)):
        if sha and not url:
            raise InputError(f"{option}-sha256 is only used with {option}")
        if url and not sha:
            raise InputError(f"{option} needs {option}-sha256 (the release tarball's sha256)")
        if url and sha:
            companions.append((name, url, sha))
    options = store_options(registry_auth, ca_file, insecure_http)
    store_dir, registry = publish.staging_target(store, cache, options)
    target = targets.get(os_name)
    req = BuildRequest(
        driver=driver,
        flavour=flavour,
        target=target,
        kernel=kernel,
        arch=arch,
        store=store_dir,
        cache=cache,
        runfile=runfile,
        runfile_sha256=runfile_sha256,
        open_source=open_source,
        open_source_sha256=open_source_sha256,
        persistenced_source=persistenced_source,
        persistenced_sha256=persistenced_sha256,
        fabricmanager=fabricmanager,
        fabricmanager_sha256=fabricmanager_sha256,
        driver_suite=driver_suite,
        jobs=jobs,
        rebuild=rebuild,
        allow_cc_mismatch=allow_cc_mismatch,
        userspace=userspace,
        sign_key=sign_key,
        sign_cert=sign_cert,
        sign_hash=sign_hash,
        smoke_test=smoke_test,
        builder=containerbuild.request_builder(builder, target),
        headers_dir=headers_dir,
        companions=tuple(companions),
    )
    validate_request(req)
    in_container = builder in containerbuild.ENGINES
    if check:
        _preview(req, in_container, as_json)
        return
    if in_container:
        if registry:
            code = _container_to_registry(builder, req, registry, options, as_json)
        else:
            cb = containerbuild.for_request(builder, req, as_json=as_json)
            code = containerbuild.run_in_container(cb).returncode
        click.get_current_context().exit(code)
    parallel.sigterm_as_interrupt()
    with _progress_renderer() as progress:
        result = build_driver(req, progress=progress)
    pushed = _push(registry, store_dir, result.published(), options, as_json) if registry else None
    if as_json:
        emit_json({**result.to_dict(), **({"pushed_index": pushed} if pushed else {})})
        return
    state = "up to date (cached, nothing compiled)" if result.cached else "built"
    click.echo(f"{result.artifact}: {state}", err=True)
    click.echo(f"  vermagic {result.manifest.vermagic}; input digest {result.input_digest[:16]}…", err=True)
    if result.userspace:
        click.echo(f"{result.userspace}", err=True)
    for note in result.notes:
        click.echo(f"  note: {note}", err=True)
    for line in next_steps(result, store=registry or store_dir, cache=cache):
        click.echo(line, err=True)


@click.command("build-matrix")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--expand", is_flag=True,
    help="Resolve the matrix against each OS's archive: exact kernels and drivers of the cells that "
    "exist; the impossible ones are refused on stderr with their reason (needed for channel selectors).",
)
@click.option(
    "--gpus", default=None, metavar="node|10de:DEVICE,...",
    help="With --expand: each kernel gets the driver and flavour its line serves for these GPUs ('node': "
    "this machine's), chosen from each driver's supported-GPU list, instead of the matrix's drivers "
    "and flavours.",
)
@click.option(
    "--branch-policy", type=click.Choice(("newest", "oldest")), default="newest", show_default=True,
    help="With --gpus: the newest or the oldest driver that supports every GPU.",
)
@click.option(
    "--by-kernel", is_flag=True,
    help="With --expand: print, per kernel the archive serves, the sources that build for it and the "
    "refused ones with their reason (`{\"kernels\": [...]}`), instead of the cells.",
)
@click.option(
    "--build", "do_build", is_flag=True, help="Build every cell here (default: only print the matrix)."
)
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Cells built at the same time (with --build), sharing one cache.",
)
@store_option
@cache_option
@click.option("--rebuild", is_flag=True, help="Force every cell to compile.")
@click.option("--userspace/--no-userspace", default=True, show_default=True)
@click.option("--smoke-test/--no-smoke-test", default=None)
@registry_options
@json_option
def build_matrix_cmd(
    file: Path,
    expand: bool,
    gpus: str | None,
    branch_policy: str,
    by_kernel: bool,
    do_build: bool,
    jobs: int,
    store: str,
    cache: Path,
    rebuild: bool,
    userspace: bool,
    smoke_test: bool | None,
    registry_auth: str | None,
    ca_file: str | None,
    insecure_http: bool,
    as_json: bool,
) -> None:
    """Expand an OS x kernels x drivers x flavours matrix (YAML) for a CI system, or build it.

    Without --build, prints `{"include": [cells]}` (GitHub Actions' matrix shape; one build-driver
    invocation per cell): as written, or with --expand the cells that exist in the archive."""
    spec = matrix.load(file)
    archive_for = matrix.archives(cache)
    follow = None
    if gpus is not None:
        if not expand:
            raise InputError("--gpus chooses the drivers the archive serves: use it with --expand")
        follow = matrix.follow_gpus(gpus, archive_for, branch_policy)
    if by_kernel and (not expand or do_build):
        raise InputError("--by-kernel lists what --expand finds: use it with --expand, without --build")
    options = store_options(registry_auth, ca_file, insecure_http)
    store_dir, registry = publish.staging_target(store, cache, options)
    if do_build:  # an index the cells would publish into is read before any cell builds (exit 2)
        artifact.read_index(store_dir)
    refused: list[matrix.Refusal] = []
    if expand:
        expansion = matrix.expand(spec, archive_for, follow=follow)
        cells, refused = expansion.cells, expansion.refused
        for refusal in refused:
            click.echo(refusal.line(), err=True)
        if by_kernel:
            emit_json({"kernels": expansion.by_kernel()})
            return
    else:
        cells = spec.cells()
    if not do_build:
        emit_json({"include": [c.to_dict() for c in cells]})
        return
    parallel.sigterm_as_interrupt()
    work = matrix.build_work(cells, jobs, os.cpu_count() or 1, store=store_dir, cache=cache, rebuild=rebuild,
                             userspace=userspace, smoke_test=smoke_test)
    results = parallel.build_cells(work, jobs)
    failed = [r for r in results if not r["ok"]]
    pushed = None
    names = parallel.published(results)
    if registry and names:  # one push for the whole matrix: one index update, no racing publishers
        pushed = _push(registry, store_dir, names, options, as_json)
    if as_json:
        emit_json({"results": results, "failed": len(failed),
                   **({"refused": [asdict(r) for r in refused]} if expand else {}),
                   **({"pushed_index": pushed} if pushed else {})})
    else:
        for r in results:
            c = r["cell"]
            what = f"{c['driver'] or 'latest'} {c['flavour']} {c['kernel'] or 'default'}"
            click.echo(
                f"{'ok  ' if r['ok'] else 'FAIL'} {what}: {r.get('name') or r.get('error')}"
                + (" (cached)" if r.get("cached") else ""),
                err=True,
            )
    if failed:
        click.get_current_context().exit(1)


@click.group("artifacts")
def artifacts_group() -> None:
    """Inspect and verify an artifact store."""


@artifacts_group.command("list")
@click.argument("store", default=str(DEFAULT_STORE))
@registry_options
@json_option
def artifacts_list(store: str, registry_auth: str | None, ca_file: str | None, insecure_http: bool,
                   as_json: bool) -> None:
    """List the artifacts of STORE (a directory, base URL with index.json, or oci:// repository;
    default: ./artifacts, where build-driver publishes)."""
    entries = Store(store, store_options(registry_auth, ca_file, insecure_http)).entries()
    if as_json:
        emit_json([asdict(e) for e in entries])
        return
    for e in entries:
        what = f"{e.flavour} {e.kernel_release}" if e.kind == "kmod" else e.arch
        click.echo(f"{e.name}  {e.kind} {e.driver_version} {what}  {e.size} bytes  sha256 {e.sha256[:12]}…")


@artifacts_group.command("push")
@click.argument("source", type=click.Path(file_okay=False, path_type=Path))
@click.argument("registry")
@click.option("--name", "names", multiple=True, metavar="FILE",
              help="Push only this artifact (repeatable; default: every artifact of SOURCE).")
@registry_options
@check_option("Verify SOURCE and print what would be pushed; the registry is not contacted.")
@json_option
def artifacts_push(source: Path, registry: str, names: tuple[str, ...], registry_auth: str | None,
                   ca_file: str | None, insecure_http: bool, check: bool, as_json: bool) -> None:
    """Publish the artifacts of the store directory SOURCE to REGISTRY (oci://HOST[:PORT]/REPO):
    blobs, one tagged manifest per artifact, and the index merged with what the registry has."""
    publish.check_push_source(source, registry)
    options = store_options(registry_auth, ca_file, insecure_http)
    publish.staging_target(registry, Path("."), options)  # refuses a digest-pinned target
    if check:
        _print_push_plan(source, registry, names, as_json)
        return
    digest = _push(registry, source, list(names) or None, options, as_json)
    if as_json:
        emit_json({"registry": registry, "index": digest})
    else:
        click.echo(digest)


def _print_push_plan(source: Path, registry: str, names: tuple[str, ...], as_json: bool) -> None:
    """artifacts push --check: the artifacts publish.push would send (the same selection)."""
    chosen, missing = publish.push_selection(source, names)
    if as_json:
        emit_json({"check": True, "registry": registry, "would_push": [e.name for e in chosen],
                   "not_in_source": missing})
        return
    for e in chosen:
        click.echo(f"would push {e.name} ({e.kind} {e.driver_version}, {e.size} bytes) to {registry}")
    for name in missing:
        click.echo(f"{name}: not in {source}, nothing to push")
    click.echo(f"would merge {len(chosen)} artifacts into the index of {registry}" if chosen
               else "nothing to push")


@artifacts_group.command("verify")
@click.argument("store", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_STORE)
@json_option
def artifacts_verify(store: Path, as_json: bool) -> None:
    """Check every artifact of the store directory STORE (default: ./artifacts, where build-driver
    publishes) against index.json and its manifest (sha256 of the tarball and of every file) and the
    extraction rules install applies. Exit 1 with one line per problem; an index or manifest
    nodeprep cannot read is refused as install refuses it (one error line, exit 2)."""
    if not store.is_dir():
        raise InputError(f"{store}: store directory does not exist")
    problems = check_store(store)
    if as_json:
        emit_json({"store": str(store), "ok": not problems, "problems": problems})
    else:
        for p in problems:
            click.echo(p)
        if not problems:
            click.echo(f"{store}: {len(artifact.LocalStore(store).entries())} artifacts verified", err=True)
    if problems:
        click.get_current_context().exit(1)


COMMANDS: list[click.Command] = [build_driver_cmd, build_matrix_cmd, artifacts_group]
