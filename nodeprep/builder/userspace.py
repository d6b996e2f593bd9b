"""The user-space artifact, made from Debian's own binary packages of one exact driver version.

Debian ships the NVIDIA user space in three package families, told apart by name:
- mainline (`libcuda1`, `libnvidia-ml1`, `nvidia-smi`, `firmware-nvidia-gsp`, …; e.g. 535.309.01),
- `tesla-<branch>` (`libnvidia-tesla-535-cuda1`, `nvidia-tesla-535-smi`, …; e.g. 535.216.03),
- `tesla` (`libnvidia-tesla-cuda1`, `nvidia-tesla-smi`, …; e.g. 525.147.05).
`nvidia-modprobe` and `nvidia-persistenced` are unversioned helpers with their own version numbers:
the newest one of the same branch not newer than the driver is taken (else the oldest newer one).

Payload (see docs/node.md):
    lib64/libX.so.<driver>  + soname links (libX.so.1)
    bin/nvidia-smi, nvidia-modprobe, nvidia-persistenced, nvidia-cuda-mps-control, nvidia-cuda-mps-server
    firmware/nvidia/<driver>/gsp*.bin
"""

from __future__ import annotations

import gzip
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .. import __version__
from ..artifact import (
    REQUIRED_BINARIES,
    REQUIRED_LIBRARIES,
    Manifest,
    artifact_name,
    input_digest,
    pack,
    read_manifest,
)
from ..digests import sha256_file
from ..errors import ArtifactError, InputError
from . import fabricmanager as fm
from . import persistenced

log = logging.getLogger(__name__)

LAYOUT = 2  # bump when the payload layout below changes (part of the input digest)
TRIPLETS = {"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}
BINARIES = (
    "nvidia-smi",
    "nvidia-modprobe",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
ELF_MAGIC = b"\x7fELF"
SONAME_LINK_RE = re.compile(r"^lib[\w.+-]+\.so\.\d+$")


class Archive(Protocol):
    """What build_userspace needs from nodeprep.sources.debian.DebianArchive."""

    release: Any  # nodeprep.targets.Archive: the manifest's OS is its name

    def update(self, max_age_s: int = ...) -> Any: ...
    def versions(self, package: str) -> list[str]: ...
    def download_many(
        self, specs: list[tuple[str, str | None]], progress: Callable[[int, int | None], None] | None = None
    ) -> list[Path]: ...
    def extract(self, deb: Path, dest: Path) -> Any: ...


@dataclass(frozen=True)
class Role:
    """One component of the user space and the package name for each family (`{t}` = family)."""

    name: str
    mainline: str
    tesla: str
    required: bool = False


ROLES = (
    Role("cuda", "libcuda1", "libnvidia-{t}-cuda1", required=True),
    Role("nvml", "libnvidia-ml1", "libnvidia-{t}-ml1", required=True),
    Role("smi", "nvidia-smi", "nvidia-{t}-smi", required=True),
    Role("ptxjit", "libnvidia-ptxjitcompiler1", "libnvidia-{t}-ptxjitcompiler1"),
    Role("nvvm", "libnvidia-nvvm4", "libnvidia-{t}-nvvm4"),
    Role("cfg", "libnvidia-cfg1", "libnvidia-{t}-cfg1"),
    Role("pkcs11", "libnvidia-pkcs11-openssl3", "libnvidia-{t}-pkcs11-openssl3"),
    Role("mps", "nvidia-cuda-mps", "nvidia-{t}-cuda-mps"),
    Role("gsp", "firmware-nvidia-gsp", "firmware-nvidia-{t}-gsp"),
    # only for /usr/share/doc/<pkg>/supported-gpus.json.gz: NVIDIA's supported-GPU list
    Role("support", "nvidia-driver", "nvidia-{t}-driver"),
)
HELPERS = ("nvidia-modprobe", "nvidia-persistenced")


def upstream_version(debian_version: str) -> str:
    """`535.309.01-0+deb12u1` -> `535.309.01` (epoch and Debian revision dropped)."""
    return debian_version.split(":", 1)[-1].rsplit("-", 1)[0]


def _vkey(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version))


def families(driver_version: str) -> list[tuple[str, str | None]]:
    """Candidate families for a driver version: (label, `{t}` value or None for mainline)."""
    branch = driver_version.split(".", 1)[0]
    return [("mainline", None), (f"tesla-{branch}", f"tesla-{branch}"), ("tesla", "tesla")]


def package_name(role: Role, tesla: str | None) -> str:
    return role.mainline if tesla is None else role.tesla.format(t=tesla)


def resolve_packages(archive: Archive, driver_version: str) -> dict[str, tuple[str, str]]:
    """role/helper name -> (package, Debian version) for `driver_version`. Raises InputError naming
    what exists when no family carries that exact version."""
    seen: dict[str, list[str]] = {}
    for label, tesla in families(driver_version):
        chosen: dict[str, tuple[str, str]] = {}
        for role in ROLES:
            pkg = package_name(role, tesla)
            versions = _versions(archive, pkg)
            if role.required:
                seen.setdefault(label, []).extend(upstream_version(v) for v in versions)
            match = next((v for v in versions if upstream_version(v) == driver_version), None)
            if match is not None:
                chosen[role.name] = (pkg, match)
            elif role.required:
                break
        else:
            for helper in HELPERS:
                picked = pick_helper(_versions(archive, helper), driver_version)
                if picked is not None:
                    chosen[helper] = (helper, picked)
            log.info(
                "driver %s: %s packages (%s)",
                driver_version,
                label,
                ", ".join(f"{p}={v}" for p, v in chosen.values()),
            )
            return chosen
    known = sorted({v for vs in seen.values() for v in vs}, key=_vkey, reverse=True)
    raise InputError(
        f"driver {driver_version}: no Debian package set (libcuda1, libnvidia-ml1, nvidia-smi "
        f"or their tesla variants) has this exact version; available: "
        f"{', '.join(known) or 'none'}"
    )


def _versions(archive: Archive, package: str) -> list[str]:
    return list(archive.versions(package))  # empty for a package the archive does not know


def pick_helper(versions: list[str], driver_version: str) -> str | None:
    """The helper version to pair with `driver_version`: exact match, else the newest of the same
    branch not newer than the driver, else the oldest newer one of that branch, else the newest."""
    if not versions:
        return None
    branch = driver_version.split(".", 1)[0]
    want = _vkey(driver_version)
    by_up = sorted(versions, key=lambda v: _vkey(upstream_version(v)), reverse=True)
    same = [v for v in by_up if upstream_version(v).split(".", 1)[0] == branch]
    for v in same:
        if upstream_version(v) == driver_version:
            return v
    older = [v for v in same if _vkey(upstream_version(v)) <= want]
    if older:
        return older[0]
    if same:
        return same[-1]
    return by_up[0]


def place(src: Path, dest: Path, mode: int) -> None:
    """`src` at `dest` with `mode`: a hard link when both are on one filesystem (the extracted
    tree is temporary), else a copy."""
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)
    os.chmod(dest, mode)


def is_elf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == ELF_MAGIC


def layout_payload(tree: Path, payload: Path, driver_version: str, arch: str) -> dict[str, list[str]]:
    """Copy what a node needs from the extracted packages in `tree` into `payload`; returns the
    relative paths per top-level directory."""
    triplet = TRIPLETS.get(arch)
    if triplet is None:
        raise InputError(f"arch {arch!r}: unsupported (known: {', '.join(TRIPLETS)})")
    lib64, bindir = payload / "lib64", payload / "bin"
    fwdir = payload / "firmware" / "nvidia" / driver_version
    for d in (lib64, bindir):
        d.mkdir(parents=True, exist_ok=True)
    out: dict[str, list[str]] = {"lib64": [], "bin": [], "firmware": [], "share": []}
    libroot = tree / "usr" / "lib" / triplet
    real: set[str] = set()
    suffix = f".so.{driver_version}"
    for p in sorted(libroot.rglob(f"lib*{suffix}")):
        if p.is_file() and not p.is_symlink() and is_elf(p):
            if p.name in real:
                raise ArtifactError(f"{p.name}: shipped twice by the selected packages")
            place(p, lib64 / p.name, 0o755)
            real.add(p.name)
            out["lib64"].append(p.name)
    for p in sorted(libroot.rglob("lib*.so.*")):
        if p.is_symlink() and SONAME_LINK_RE.match(p.name) and os.readlink(p) in real:
            if not (lib64 / p.name).exists():
                (lib64 / p.name).symlink_to(os.readlink(p))
                out["lib64"].append(p.name)
    for name in BINARIES:
        found = [p for p in sorted(tree.rglob(name)) if p.is_file() and not p.is_symlink() and is_elf(p)]
        if found:
            place(found[0], bindir / name, 0o755)  # nvidia-modprobe is setuid in Debian: not in ours
            out["bin"].append(name)
    for p in sorted((tree / "usr" / "share" / "doc").glob("*/supported-gpus.json.gz"))[:1]:
        (payload / "share").mkdir(exist_ok=True)
        (payload / "share" / "supported-gpus.json").write_bytes(gzip.decompress(p.read_bytes()))
        out["share"].append("supported-gpus.json")
    fwsrc = tree / "lib" / "firmware" / "nvidia" / driver_version
    for p in sorted(fwsrc.glob("gsp*.bin")) if fwsrc.is_dir() else []:
        fwdir.mkdir(parents=True, exist_ok=True)
        place(p, fwdir / p.name, 0o644)
        out["firmware"].append(f"nvidia/{driver_version}/{p.name}")
    check_required(real, out["bin"], driver_version, "the selected packages")
    return out


def check_required(libraries: set[str], binaries: list[str], driver_version: str, where: str) -> None:
    """ArtifactError unless the payload's `libraries` and `binaries` hold what every user space must."""
    for base in REQUIRED_LIBRARIES:
        if f"{base}.{driver_version}" not in libraries:
            raise ArtifactError(f"driver {driver_version}: {base}.{driver_version} not found in {where}")
    for name in REQUIRED_BINARIES:
        if name not in binaries:
            raise ArtifactError(f"driver {driver_version}: no {name} ELF binary in {where}")


def digest_params(driver_version: str, arch: str, persistenced: dict[str, Any] | None = None,
                  fabricmanager: str | None = None) -> dict[str, object]:
    """The build parameters in a user-space artifact's input digest (beside its packages' sha256s);
    `persistenced`: those of an nvidia-persistenced built from source (builder.persistenced)."""
    out: dict[str, object] = {"kind": "userspace", "driver_version": driver_version, "arch": arch,
                              "layout": LAYOUT}
    if persistenced is not None:
        out["persistenced"] = persistenced
    if fabricmanager is not None:  # its version (the archive is an input)
        out["fabricmanager"] = fabricmanager
    return out


PERSISTENCED_PARAMS = ("format", "version", "build_root", "packages_sha256")


def is_current(manifest: Manifest) -> bool:
    """Whether an existing user-space artifact was made the way this nodeprep makes it: its input
    digest, recomputed from its own recorded inputs with today's parameters, is unchanged (an
    nvidia-persistenced built from source: with the parameters its record keeps, its FORMAT today's)."""
    rec = manifest.extra.get("persistenced")
    built = None
    if isinstance(rec, dict) and rec.get("from") == "source":
        if rec.get("format") != persistenced.FORMAT:
            return False
        built = {k: rec.get(k) for k in PERSISTENCED_PARAMS}
    fm = manifest.extra.get("fabricmanager")
    params = digest_params(manifest.driver_version, manifest.arch, built,
                           fm.get("version") if isinstance(fm, dict) else None)
    return input_digest(manifest.inputs, params) == manifest.input_digest


def persistenced_warning(manifest: Manifest) -> str | None:
    """One line when the user space's nvidia-persistenced is not the driver's version (Debian's
    package is versioned apart: bookworm's 535.171.04 beside driver 535.309.01); None when it is, or
    when the artifact records none."""
    rec = manifest.extra.get("persistenced")
    packages = manifest.extra.get("packages")
    if rec is None and isinstance(packages, dict) and isinstance(packages.get("nvidia-persistenced"), str):
        # made before the record was kept: the package list names it
        debian = packages["nvidia-persistenced"]
        rec = {"version": upstream_version(debian), "package": f"nvidia-persistenced={debian}"}
    if not isinstance(rec, dict) or not rec.get("version") or rec["version"] == manifest.driver_version:
        return None
    where = f"Debian's {rec['package']}" if rec.get("package") else str(rec.get("from", "unknown"))
    return (f"nvidia-persistenced {rec['version']} ({where}) is not the driver's {manifest.driver_version}: "
            "kept as it is; --persistenced-source builds it from NVIDIA's source at the driver's version")


def build_userspace(
    archive: Archive,
    driver_version: str,
    dest_dir: Path,
    *,
    arch: str = "amd64",
    progress: Callable[[int, int | None], None] | None = None,
    persistenced: Any = None,
    fabricmanager: Any = None,
) -> tuple[Path, Manifest]:
    """Build (or reuse) `nvidia-userspace-<driver>-<arch>.tar.zst` in `dest_dir` from the Debian
    packages of exactly `driver_version`. Same packages -> same input digest -> no rebuild.
    `progress(bytes, total)` follows the packages' download. `persistenced`: an nvidia-persistenced
    built from NVIDIA's source (builder.persistenced.Built), which replaces Debian's; `fabricmanager`:
    Fabric Manager of the driver's version (builder.fabricmanager.FabricManager), added."""
    archive.update()
    chosen = resolve_packages(archive, driver_version)
    paths = archive.download_many(list(chosen.values()), progress)
    debs = dict(zip(chosen, paths, strict=True))
    inputs = {Path(deb).name: sha256_file(Path(deb)) for deb in debs.values()}
    if persistenced is not None:
        inputs[persistenced.source] = persistenced.sha256
        record: dict[str, Any] = persistenced.record()
    elif "nvidia-persistenced" in chosen:
        record = {"version": upstream_version(chosen["nvidia-persistenced"][1]), "from": "debian",
                  "package": "=".join(chosen["nvidia-persistenced"])}
    else:
        record = {}
    if fabricmanager is not None:
        inputs[fabricmanager.name] = fabricmanager.sha256
    os_name = archive.release.name
    digest = input_digest(inputs, digest_params(
        driver_version, arch, persistenced.params() if persistenced is not None else None,
        fabricmanager.version if fabricmanager is not None else None))
    dest_dir = Path(dest_dir)
    if (done := up_to_date(dest_dir, driver_version, arch, digest)) is not None:
        return done
    with tempfile.TemporaryDirectory(prefix="nodeprep-userspace-") as tmp:
        tree, payload = Path(tmp) / "tree", Path(tmp) / "payload"
        # dpkg-deb -x is xz-bound: unpack the packages side by side (one tree, disjoint files).
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            list(pool.map(lambda deb: archive.extract(Path(deb), tree), debs.values()))
        contents = layout_payload(tree, payload, driver_version, arch)
        if persistenced is not None:
            dest = payload / "bin" / "nvidia-persistenced"
            dest.unlink(missing_ok=True)
            place(Path(persistenced.binary), dest, 0o755)
            contents["bin"] = sorted({*contents["bin"], "nvidia-persistenced"})
        extra: dict[str, object] = {"packages": {pkg: version for pkg, version in chosen.values()}}
        if record:
            extra["persistenced"] = record
        if fabricmanager is not None:
            fm.place(fabricmanager, payload, contents)
            extra["fabricmanager"] = fabricmanager.record()
        return pack_userspace(payload, dest_dir, driver_version, arch, os_name, digest, inputs, contents,
                              extra)


def up_to_date(dest_dir: Path, driver_version: str, arch: str, digest: str) -> tuple[Path, Manifest] | None:
    """The user-space artifact in `dest_dir` when it was made from these inputs (`digest`), else None."""
    existing = Path(dest_dir) / artifact_name("userspace", driver_version, arch=arch)
    if existing.exists():
        try:
            old = read_manifest(existing)
            if old.input_digest == digest:
                log.info("%s: up to date (input digest %s…)", existing.name, digest[:12])
                return existing, old
        except ArtifactError:
            pass
    return None


def pack_userspace(payload: Path, dest_dir: Path, driver_version: str, arch: str, os_name: str, digest: str,
                   inputs: dict[str, str], contents: dict[str, list[str]],
                   source: dict[str, object]) -> tuple[Path, Manifest]:
    """The laid-out `payload` packed as the user-space artifact (whatever it was made from: `source`)."""
    manifest = Manifest(kind="userspace", driver_version=driver_version, arch=arch, os=os_name,
                        input_digest=digest, inputs=inputs, nodeprep_version=__version__,
                        extra={**source, "contents": {k: len(v) for k, v in contents.items()}})
    return pack(payload, manifest, Path(dest_dir))


def supported_gpus(archive: Archive, driver_version: str) -> str | None:
    """NVIDIA's supported-gpus.json of `driver_version`, from the archive's package that carries it
    for the user space (the `support` role: nvidia-driver or its tesla variant, the file
    /usr/share/doc/<package>/supported-gpus.json.gz); None when no package set has that version or
    its package has no list."""
    try:
        chosen = resolve_packages(archive, driver_version)
    except InputError:
        return None
    if "support" not in chosen:
        return None
    (deb,) = archive.download_many([chosen["support"]])
    with tempfile.TemporaryDirectory(prefix="nodeprep-gpus-") as tmp:
        archive.extract(Path(deb), Path(tmp))
        for p in sorted((Path(tmp) / "usr" / "share" / "doc").glob("*/supported-gpus.json.gz")):
            return gzip.decompress(p.read_bytes()).decode("utf-8", "replace")
    return None
