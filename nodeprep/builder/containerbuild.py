"""`--builder podman|docker`: run the same build-driver inside the target OS's container image.

The image comes from images/<image>/Containerfile (the target's `builder_image`, by default its
own `image`: images/<os>/); the repository is mounted read-only at /src, the
store and cache read-write at /store and /cache, and the container runs `nodeprep build-driver` with
the same arguments:

- OSes whose target builder is chroot (debian-12, debian-13): image `nodeprep-builder:debian-12`
  for both (the build root is made inside, by mmdebstrap, for the target's own suite), and
  `--builder chroot` inside (the same mmdebstrap build root as on a host);
- the others (ubuntu-22.04, ubuntu-24.04, rhel-9): the image installs the exact kernel's headers and
  compiler, so it is built per kernel (`--build-arg KERNEL_RELEASE=<kernel>`, tag
  `nodeprep-builder:<os>-<kernel>`; `--kernel` is required) and runs `--builder host` inside.

Only the argv is built here; `run_in_container` checks that the engine exists and answers first.

An `oci://` store never enters the container: the container builds into a fresh directory store
under the cache (`staging_store`), and the host pushes what it holds with the same code as
`nodeprep artifacts push` (nodeprep/commands/build.py), so registry credentials stay on the host
(not in the container's argv, environment or mounts).
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import runner
from ..errors import InputError
from ..sources.companions import COMPANIONS
from ..targets import TargetOS

log = logging.getLogger(__name__)

ENGINES = ("podman", "docker")
REPO = Path(__file__).resolve().parents[2]
# The engine's own configuration passed through to it (runner.run starts commands with a clean
# environment): which engine/daemon, its config and storage files. Nothing of it reaches the
# container (no --env-host; the container gets only the -e of run_argv).
ENGINE_ENV = (
    "CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF", "CONTAINERS_REGISTRIES_CONF", "CONTAINER_HOST",
    "CONTAINER_CONNECTION", "DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_CONFIG", "DOCKER_TLS_VERIFY",
    "DOCKER_CERT_PATH", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME",
)


def inner_builder(target: TargetOS) -> str:
    """The builder the OS's image runs inside: its target's (chroot for Debian, host otherwise)."""
    return target.builder


def request_builder(builder: str, target: TargetOS) -> str:
    """The builder a BuildRequest for `--builder builder` records: for podman/docker the one the
    image runs inside (`inner_builder`), else `builder` itself."""
    return inner_builder(target) if builder in ENGINES else builder


@dataclass(frozen=True)
class ContainerBuild:
    engine: str
    target: TargetOS
    store: Path
    cache: Path
    args: tuple[str, ...]  # build-driver arguments other than --store/--cache/--builder
    repo: Path = REPO
    mounts: tuple[tuple[Path, str], ...] = ()  # (host path, container path), read-only
    kernel: str | None = None  # required for the per-kernel images (the host-builder OSes)

    @property
    def inner_builder(self) -> str:
        return inner_builder(self.target)

    @property
    def image_name(self) -> str:
        """images/<this>/ is the image's recipe and build context (the target's builder image)."""
        return self.target.builder_image or self.target.image

    @property
    def image(self) -> str:
        if self.inner_builder == "host":
            return f"nodeprep-builder:{self.image_name}-{self.kernel}"
        return f"nodeprep-builder:{self.image_name}"

    @property
    def containerfile(self) -> Path:
        return self.repo / "images" / self.image_name / "Containerfile"


def build_image_argv(cb: ContainerBuild) -> list[str]:
    build_args = ["--build-arg", f"KERNEL_RELEASE={cb.kernel}"] if cb.inner_builder == "host" else []
    return [
        cb.engine,
        "build",
        *build_args,
        "-t",
        cb.image,
        "-f",
        os.fspath(cb.containerfile),
        os.fspath(cb.containerfile.parent),
    ]


def run_argv(cb: ContainerBuild) -> list[str]:
    # --privileged: the chroot build inside uses chroot and mmdebstrap's root mode, like on a host.
    return [
        cb.engine,
        "run",
        "--rm",
        "--privileged",
        "--network=host",
        "-v",
        f"{cb.repo.resolve()}:/src:ro",
        "-v",
        f"{cb.store.resolve()}:/store",
        "-v",
        f"{cb.cache.resolve()}:/cache",
        *[a for host, inside in cb.mounts for a in ("-v", f"{host.resolve()}:{inside}:ro")],
        "-w",
        "/src",
        "-e",
        "PYTHONPATH=/src",
        cb.image,
        "python3",
        "-m",
        "nodeprep.cli",
        "build-driver",
        "--builder",
        cb.inner_builder,
        "--store",
        "/store",
        "--cache",
        "/cache",
        *cb.args,
    ]


def for_request(engine: str, req: Any, *, as_json: bool = False) -> ContainerBuild:
    """The container run of BuildRequest `req`: the same options, paths mapped into the container
    (store -> /store, cache -> /cache, runfile/release/keys mounted read-only under /inputs)."""
    if inner_builder(req.target) == "host" and not req.kernel:
        raise InputError(
            f"--builder {engine} --os {req.target.name}: --kernel RELEASE is required "
            "(the image installs that kernel's headers)"
        )
    args: list[str] = ["--os", req.target.name, "--flavour", req.flavour, "--arch", req.arch]
    mounts: list[tuple[Path, str]] = []

    def mount(path: Path | str, name: str) -> str:
        inside = f"/inputs/{name}/{Path(path).name}"
        mounts.append((Path(path), inside))
        return inside

    if req.driver:
        args += ["--driver", req.driver]
    if req.kernel:
        args += ["--kernel", req.kernel]
    def source(flag: str, value: str, sha_flag: str, sha: str | None, name: str) -> list[str]:
        """A source file or URL and its digest: a local file mounted read-only, a URL as it is."""
        return [flag, value if "://" in value else mount(value, name), sha_flag, sha or ""]

    if req.runfile:
        args += source("--runfile", req.runfile, "--sha256", req.runfile_sha256, "runfile")
    if req.driver_suite:
        args += ["--driver-suite", req.driver_suite]
    if req.open_source:
        args += source("--open-source", req.open_source, "--open-source-sha256", req.open_source_sha256,
                       "open-source")
    if req.persistenced_source:
        args += source("--persistenced-source", req.persistenced_source, "--persistenced-sha256",
                       req.persistenced_sha256, "persistenced")
    if req.fabricmanager:
        args += source("--fabricmanager", req.fabricmanager, "--fabricmanager-sha256",
                       req.fabricmanager_sha256, "fabricmanager")
    for name, url, sha in req.companions:
        option = COMPANIONS[name].option
        args += source(option, url, f"{option}-sha256", sha, name)
    if req.jobs:
        args += ["--jobs", str(req.jobs)]
    for flag, on in (
        ("--rebuild", req.rebuild),
        ("--allow-cc-mismatch", req.allow_cc_mismatch),
        ("--no-userspace", not req.userspace),
        ("--json", as_json),
    ):
        if on:
            args.append(flag)
    if req.sign_key and req.sign_cert:
        key = str(req.sign_key) if str(req.sign_key).startswith("pkcs11:") else mount(req.sign_key, "key")
        args += ["--sign-key", key, "--sign-cert", mount(req.sign_cert, "cert"), "--sign-hash", req.sign_hash]
    if req.smoke_test is not None:
        args.append("--smoke-test" if req.smoke_test else "--no-smoke-test")
    return ContainerBuild(
        engine=engine,
        target=req.target,
        store=Path(req.store),
        cache=Path(req.cache),
        args=tuple(args),
        mounts=tuple(mounts),
        kernel=req.kernel,
    )


def engine_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The ENGINE_ENV variables set in `environ` (default: this process's environment)."""
    env = os.environ if environ is None else environ
    return {k: env[k] for k in ENGINE_ENV if k in env}


def staging_store(cache: Path) -> Path:
    """A fresh, empty directory store under `<cache>/oci-publish/` for one container build whose
    result the host pushes to a registry (everything in it is that build's; remove it after)."""
    parent = cache / "oci-publish"
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="container-", dir=parent))


def check_engine(engine: str) -> str:
    if engine not in ENGINES:
        raise InputError(f"--builder: {engine!r} is not one of chroot, {', '.join(ENGINES)}")
    path = runner.which(engine)
    if path is None:
        raise InputError(
            f"--builder {engine}: {engine} is not installed (use --builder chroot, or install {engine})"
        )
    res = runner.run([engine, "info"], check=False, timeout=30, env=engine_env())
    if res.returncode != 0:
        first = (res.stderr or res.stdout).strip().splitlines()
        raise InputError(
            f"--builder {engine}: the {engine} engine is not usable" + (f" ({first[-1]})" if first else "")
        )
    return path


def run_in_container(cb: ContainerBuild, *, capture: bool = False) -> runner.Result:
    """Build the image (cached by the engine) and run the build in it; its Result (stdout and
    stderr captured only with `capture`, else on this process's)."""
    check_engine(cb.engine)
    if not cb.containerfile.is_file():
        raise InputError(f"--builder {cb.engine}: no {cb.containerfile} for OS {cb.target.name}")
    cb.store.mkdir(parents=True, exist_ok=True)
    cb.cache.mkdir(parents=True, exist_ok=True)
    env = engine_env()
    # the image build's output is logged (stderr; its tail is in the error if it fails): stdout is
    # the build's (its --json result)
    runner.run(build_image_argv(cb), timeout=3600, env=env, on_line=log.info)
    return runner.run(run_argv(cb), capture=capture, check=False, timeout=4 * 3600, env=env)
