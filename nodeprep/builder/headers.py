"""Kernel headers of a Debian kernel release: which packages, and where they go in a build root.

`linux-headers-<release>` (arch-specific: .config, Module.symvers, generated headers) depends on
`linux-headers-<abi>-common` (the source headers, pinned with '=') and `linux-kbuild-<series>`
(fixdep, modpost, ... pinned with '>='). The default release is the one the `linux-headers-<flavour>`
metapackage points at, i.e. the kernel a fresh Debian install runs.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..vocab import KERNEL_RELEASE_RE, version_key

DEP_RE = re.compile(r"^\s*(?P<name>[a-z0-9][a-z0-9.+-]*)(?:\s*\((?P<op>[<>=]+)\s*(?P<version>[^)\s]+)\s*\))?")


@dataclass(frozen=True)
class KernelHeaders:
    release: str
    packages: tuple[tuple[str, str], ...]  # (package, version): headers, -common, kbuild


def parse_depends(depends: str) -> list[tuple[str, str | None, str | None]]:
    """'a (= 1), b (>= 2) | c, d' -> [(a, '=', 1), (b, '>=', 2), (d, None, None)] (first alternative)."""
    out = []
    for clause in depends.split(","):
        first = clause.split("|")[0]
        m = DEP_RE.match(first)
        if m:
            out.append((m["name"], m["op"], m["version"]))
    return out


def available_releases(package_names: list[str], flavour: str = "amd64") -> list[str]:
    """Kernel releases with headers of `flavour` (e.g. amd64, cloud-amd64), newest first."""
    releases = []
    for name in package_names:
        rel = name.removeprefix("linux-headers-")
        release = name.startswith("linux-headers-") and KERNEL_RELEASE_RE.fullmatch(rel)
        if release and rel.endswith("-" + flavour):
            prefix = rel[: -len(flavour) - 1]
            if not re.search(r"-(cloud|rt)$", prefix):  # 6.1.0-56-cloud-amd64 is not flavour amd64
                releases.append(rel)
    return sorted(releases, key=version_key, reverse=True)


def all_releases(package_names: list[str]) -> list[str]:
    names = [n.removeprefix("linux-headers-") for n in package_names if n.startswith("linux-headers-")]
    return sorted(
        (
            r
            for r in names
            if KERNEL_RELEASE_RE.fullmatch(r) and not r.endswith("-common") and not r.endswith("-common-rt")
        ),
        key=version_key,
        reverse=True,
    )


def default_release(meta_depends: str) -> str | None:
    """The release the `linux-headers-<flavour>` metapackage depends on."""
    for name, _, _ in parse_depends(meta_depends):
        rel = name.removeprefix("linux-headers-")
        if name.startswith("linux-headers-") and KERNEL_RELEASE_RE.fullmatch(rel):
            return rel
    return None


def pick_version(versions: list[str], op: str | None, wanted: str | None) -> str | None:
    """A version satisfying `op wanted` from `versions` (newest first): '=' exact, else the
    exact `wanted` when served, else the newest."""
    if not versions:
        return None
    if op == "=" or (wanted and wanted in versions):
        return wanted if wanted in versions else None
    return versions[0]


def current_default(archive: Any, *, arch: str = "amd64", names: list[str] | None = None) -> str:
    """The archive's current default kernel release: what `linux-headers-<arch>` depends on (else
    the newest release with headers of that flavour)."""
    try:
        meta = archive.info(f"linux-headers-{arch}")
    except InputError:
        meta = {}
    release = default_release(meta.get("Depends", ""))
    if release is None:
        names = archive.packages(r"^linux-headers-[0-9]") if names is None else names
        rels = available_releases(names, arch)
        if not rels:
            raise InputError(f"no linux-headers-*-{arch} packages in the Debian archive")
        release = rels[0]
    return release


def served_releases(archive: Any, *, arch: str = "amd64", names: list[str] | None = None,
                    match: Callable[[str], bool] = lambda r: True, limit: int | None = None) -> list[str]:
    """Up to `limit` kernel releases of flavour `arch` (and `match`) whose headers the archive
    serves now, newest first (names in the lists whose package has no version are left out)."""
    names = archive.packages(r"^linux-headers-[0-9]") if names is None else names
    out: list[str] = []
    for r in available_releases(names, arch):
        if limit is not None and len(out) >= limit:
            break
        if match(r) and archive.versions(f"linux-headers-{r}"):
            out.append(r)
    return out


def resolve(archive: Any, release: str | None, *, arch: str = "amd64") -> KernelHeaders:
    """Packages providing the headers of `release` (None: the current default kernel)."""
    names = archive.packages(r"^linux-headers-[0-9]")
    if release is None:
        release = current_default(archive, arch=arch, names=names)
    package = f"linux-headers-{release}"
    if package not in names or not archive.versions(package):
        avail = all_releases(names)
        raise InputError(
            f"--kernel: no headers for kernel {release!r} in the Debian archive "
            f"(available: {', '.join(avail) or 'none'})"
        )
    version = archive.versions(package)[0]
    fields = archive.info(package, version)
    pkgs = [(package, version)]
    for name, op, want in parse_depends(fields.get("Depends", "")):
        if name.startswith("linux-headers-") and name.endswith("-common") or name.startswith("linux-kbuild-"):
            v = pick_version(archive.versions(name), op, want)
            if v is None:
                raise InputError(
                    f"{package} {version} needs {name} ({op} {want}), which the archive does not serve"
                )
            pkgs.append((name, v))
    return KernelHeaders(release=release, packages=tuple(pkgs))


def install_into(stage: Path, root: Path) -> None:
    """Move an extracted package tree `stage` into build root `root` (a merged-/usr system:
    stage/lib, stage/bin ... go under root/usr/...). Files replace, never write through, links."""
    for top in ("lib", "bin", "sbin", "lib64"):
        src = stage / top
        if src.is_dir() and not src.is_symlink():
            _merge(src, stage / "usr" / top)
            shutil.rmtree(src)
    _merge(stage, root)


def _merge(src: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for entry in sorted(src.iterdir()):
        target = dest / entry.name
        if entry.is_dir() and not entry.is_symlink():
            if target.is_symlink() or (target.exists() and not target.is_dir()):
                target.unlink()
            _merge(entry, target)
        else:
            if target.is_symlink() or target.exists():
                target.unlink()  # never write through a hard link into the cached root
            shutil.move(entry, target)
