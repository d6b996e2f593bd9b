"""Build roots: a minimal rootfs of the target OS (mmdebstrap), cached and reused.

One root per (OS, recipe): `<cache>/buildroots/<os>-<key>/root`, where `key` hashes the recipe
(suite, variant, package list). The packages it actually got (`name=version`, from dpkg) are
recorded beside it in `packages.txt`; that list goes into every build's input digest, so a
refreshed root means new artifacts. Each build works in a hard-link clone of the root
(`cp -al`, about a second) so parallel builds never share a build directory; files added to a
clone replace links instead of writing through them (see headers.install_into).

The recipe of each OS is in nodeprep/targets/ and documented in images/<os>/ (README.md,
packages.list).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .. import runner, targets
from ..digests import canonical_json, sha256_bytes, sha256_file
from ..errors import CommandError, InputError, NetworkError
from ..targets import TargetOS
from .headers import install_into

log = logging.getLogger(__name__)

RECIPE_VERSION = 1
MMDEBSTRAP_TIMEOUT = 1800


@dataclass(frozen=True)
class BuildRootRecipe:
    os_name: str
    suite: str
    packages: tuple[str, ...]
    variant: str = "minbase"
    components: tuple[str, ...] = ("main",)

    @property
    def key(self) -> str:
        return sha256_bytes(
            canonical_json(
                {
                    "recipe": RECIPE_VERSION,
                    "os": self.os_name,
                    "suite": self.suite,
                    "variant": self.variant,
                    "components": list(self.components),
                    "packages": sorted(self.packages),
                }
            )
        )[:16]


def recipe_for(target: TargetOS, kernel: str | None = None, extra: tuple[str, ...] = ()) -> BuildRootRecipe:
    """The chroot build root recipe of `target` for the kernel line of `kernel`
    (nodeprep.targets holds the packages: the OS's, plus the line's `buildroot_extra`), plus the
    packages `extra` the driver sources need (an open-source release: its BUILD_PACKAGES)."""
    if not target.has_buildroot or target.suite is None:
        have = [t.name for t in targets.all_targets() if t.has_buildroot]
        raise InputError(
            f"--os: {target.name} has no chroot build root (its builder is {target.builder}; chroot "
            f"build roots: {', '.join(have)}); use --builder host or podman/docker"
        )
    line_extra = targets.channel(target, kernel).buildroot_extra
    return BuildRootRecipe(
        os_name=target.name, suite=target.suite, packages=target.buildroot_packages + line_extra + extra
    )


@dataclass(frozen=True)
class BuildRoot:
    path: Path  # the root filesystem
    recipe: BuildRootRecipe
    packages: tuple[str, ...]  # "name=version", sorted

    @property
    def packages_sha256(self) -> str:
        return sha256_bytes("\n".join(self.packages).encode())


def mmdebstrap_argv(recipe: BuildRootRecipe, target: Path, mirror: str,
                    security_mirror: str | None) -> list[str]:
    comps = " ".join(recipe.components)
    sources = [f"deb {mirror} {recipe.suite} {comps}", f"deb {mirror} {recipe.suite}-updates {comps}"]
    if security_mirror:
        sources.append(f"deb {security_mirror} {recipe.suite}-security {comps}")
    return [
        "mmdebstrap",
        f"--variant={recipe.variant}",
        "--mode=root",
        "--format=directory",
        "--include=" + ",".join(recipe.packages),
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        recipe.suite,
        os.fspath(target),
        *sources,
    ]


def installed_packages(root: Path) -> tuple[str, ...]:
    out = runner.run(
        [
            "dpkg-query",
            f"--admindir={root / 'var/lib/dpkg'}",
            "-W",
            "-f=${Package}:${Architecture}=${Version}\\n",
        ]
    ).stdout
    return tuple(sorted(line.strip() for line in out.splitlines() if line.strip()))


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def cached(recipe: BuildRootRecipe, cache: Path) -> bool:
    """Whether the build root for `recipe` is already in `cache` (ensure() returns at once)."""
    final = cache / "buildroots" / f"{recipe.os_name}-{recipe.key}"
    return (final / "packages.txt").is_file() and (final / "root").is_dir()


def ensure(recipe: BuildRootRecipe, cache: Path, *, mirror: str,
           security_mirror: str | None = None) -> BuildRoot:
    """The cached build root for `recipe`, created with mmdebstrap on first use."""
    base = cache / "buildroots"
    final = base / f"{recipe.os_name}-{recipe.key}"
    with _flock(base / f".{final.name}.lock"):
        if cached(recipe, cache):
            return _load(final, recipe)
        if not runner.which("mmdebstrap"):
            raise InputError(
                "mmdebstrap not found: install it (scripts/deps/build.apt lists what building needs)"
            )
        with _staged(final) as tmp:
            log.info(
                "Creating the %s build root with mmdebstrap (once per recipe; cached in %s)",
                recipe.os_name,
                final,
            )
            try:
                runner.run(
                    mmdebstrap_argv(recipe, tmp / "root", mirror, security_mirror),
                    timeout=MMDEBSTRAP_TIMEOUT,
                    log_path=tmp / "mmdebstrap.log",
                )
            except CommandError as e:
                raise NetworkError(
                    f"mmdebstrap could not create the {recipe.os_name} build root from {mirror}", hint=e.tail
                ) from None
            pkgs = installed_packages(tmp / "root")
            (tmp / "packages.txt").write_text("\n".join(pkgs) + "\n")
            (tmp / "recipe.json").write_bytes(
                canonical_json(
                    {
                        "os": recipe.os_name,
                        "suite": recipe.suite,
                        "variant": recipe.variant,
                        "packages": list(recipe.packages),
                        "mirror": mirror,
                    }
                )
            )
        return _load(final, recipe)


def with_headers(build_root: BuildRoot, debs: list[Path], cache: Path) -> BuildRoot:
    """`build_root` plus the kernel header packages `debs`, as a cached hard-link layer beside it
    (`<root dir>+headers-<key>`, key = the .debs' sha256), so a build only adds its sources."""
    return with_debs(build_root, debs, cache, "headers")


def with_debs(build_root: BuildRoot, debs: list[Path], cache: Path, label: str,
              packages: tuple[str, ...] = ()) -> BuildRoot:
    """`build_root` plus the packages `debs` (unpacked, no maintainer scripts), as a cached hard-link layer
    beside it (`<root dir>+<label>-<key>`, key = the .debs' sha256); `packages` ("name=version" of
    those debs) are added to the layer's package list (a build's input digest names them)."""
    key = sha256_bytes(
        canonical_json(
            {
                "base": build_root.path.parent.name,
                "packages": list(build_root.packages),
                "debs": sorted(sha256_file(d) for d in debs),
            }
        )
    )[:16]
    base = cache / "buildroots"
    final = base / f"{build_root.path.parent.name}+{label}-{key}"
    layered = replace(build_root, path=final / "root",
                      packages=tuple(sorted({*build_root.packages, *packages})))
    with _flock(base / f".{final.name}.lock"):
        if (final / ".complete").is_file():
            return layered
        with _staged(final) as tmp:
            runner.run(["cp", "-al", build_root.path, tmp / "root"], timeout=600)
            for deb in debs:
                stage = Path(tempfile.mkdtemp(prefix="stage.", dir=tmp))
                runner.run(["dpkg-deb", "-x", deb, stage])
                install_into(stage, tmp / "root")  # replaces links, never writes through them
                shutil.rmtree(stage)
            (tmp / ".complete").write_text("\n".join(sorted(d.name for d in debs)) + "\n")
    return layered


@contextlib.contextmanager
def _staged(final: Path) -> Iterator[Path]:
    """A new directory beside `final` (mode 0755) that replaces `final` as a whole when the block
    succeeds; removed when it fails."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        os.chmod(tmp, 0o755)
        yield tmp
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _load(final: Path, recipe: BuildRootRecipe) -> BuildRoot:
    pkgs = tuple(line for line in (final / "packages.txt").read_text().splitlines() if line)
    return BuildRoot(path=final / "root", recipe=recipe, packages=pkgs)


def mounts_under(path: Path) -> list[str]:
    """Mount points strictly below `path`, deepest first."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    prefix = os.fspath(path.resolve()) + "/"
    points = [ln.split()[1].encode().decode("unicode_escape") for ln in lines if len(ln.split()) > 1]
    return sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True)


IN_USE = ".in-use"  # flock held by the process working in a private directory (see sweep_stale)
_HELD: dict[tuple[int, int], int] = {}  # (st_dev, st_ino) of a private directory -> its lock's fd
YOUNG_S = 120.0  # a directory without a lock file this young may still be getting it


def _release(key: tuple[int, int] | None) -> None:
    fd = _HELD.pop(key, None) if key else None
    if fd is not None:
        os.close(fd)


def _key(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def remove_tree(path: Path) -> None:
    """Unmount whatever is mounted below `path` (deepest first), then delete it (and let go of its
    in-use lock when it is one of this process's private directories)."""
    key = _key(path)
    for point in mounts_under(path):
        runner.run(["umount", "-l", point], check=False)
    shutil.rmtree(path, ignore_errors=True)
    _release(key)


def private_dir(parent: Path, kind: str) -> Path:
    """A new directory `<kind>.<pid>.<random>` under `parent`, marked in use by an flock on its
    `.in-use` file for as long as this process works in it (see sweep_stale)."""
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"{kind}.{os.getpid()}.", dir=parent))
    fd = os.open(path / IN_USE, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    key = _key(path)
    assert key is not None
    _HELD[key] = fd
    return path


def keep_modules(built: Sequence[Path], kept: Path, staging_parent: Path, **record: str) -> None:
    """Put the built modules (mode 0644) and their modules.json (`{"modules": [file names],
    **record}`) in place of the cache entry `kept`, whole: assembled in a private directory under
    `staging_parent`, then renamed over it."""
    staging = private_dir(staging_parent, "modules")
    try:
        for p in built:
            shutil.copyfile(p, staging / p.name)
            os.chmod(staging / p.name, 0o644)
        (staging / "modules.json").write_text(
            json.dumps({"modules": [p.name for p in built], **record}, sort_keys=True)
        )
        kept.parent.mkdir(parents=True, exist_ok=True)
        if kept.exists():
            shutil.rmtree(kept)
        os.replace(staging, kept)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _in_use(entry: Path) -> bool:
    """Whether a process (in any PID namespace: a build in a container or an unshared test shares
    the cache but not our PIDs) still works in the private directory `entry`."""
    try:
        fd = os.open(entry / IN_USE, os.O_WRONLY | os.O_CLOEXEC)
    except FileNotFoundError:  # made by an older nodeprep, or this instant: the owner's PID decides
        parts = entry.name.split(".")
        try:
            young = time.time() - entry.stat().st_mtime < YOUNG_S
            os.kill(int(parts[1]), 0)
            return True  # still running
        except ProcessLookupError:
            return young
        except (PermissionError, OSError):
            return True
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False  # nobody holds it: its owner is gone (it is released when fd closes)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def sweep_stale(parent: Path) -> list[Path]:
    """Remove directories under `parent` left by processes that no longer exist (a build killed
    with SIGKILL or a power loss cannot clean up after itself); returns what was removed."""
    removed: list[Path] = []
    if not parent.is_dir():
        return removed
    for entry in parent.iterdir():
        parts = entry.name.split(".")
        if len(parts) < 3 or not parts[1].isdigit() or _key(entry) in _HELD or _in_use(entry):
            continue
        log.info("Removing %s left by an interrupted build", entry)
        remove_tree(entry)
        removed.append(entry)
    return removed


@contextlib.contextmanager
def workspace(
    build_root: BuildRoot, parent: Path, *, cleanup: list[threading.Thread] | None = None
) -> Iterator[Path]:
    """A private hard-link clone of `build_root` under `parent`; removed (and unmounted) on exit.

    With `cleanup`, a successful block's clone is unmounted, renamed and deleted by a thread
    appended there (the caller joins it before returning), so deleting the build's object files
    overlaps packing; after an error it is removed before the exception propagates."""
    tmp = private_dir(parent, "build")
    ok = False
    try:
        clone = tmp / "root"
        runner.run(["cp", "-al", build_root.path, clone], timeout=600)
        yield clone
        ok = True
    finally:
        if ok and cleanup is not None:
            for point in mounts_under(tmp):
                runner.run(["umount", "-l", point], check=False)
            trash = tmp.with_name("trash." + tmp.name.split(".", 1)[1])
            os.rename(tmp, trash)
            thread = threading.Thread(target=remove_tree, args=(trash,))
            thread.start()
            cleanup.append(thread)
        else:
            remove_tree(tmp)
