"""The one real driver build the slow tier shares.

`ensure_real_build(cache)` builds the newest proprietary driver of Debian 12's
nvidia-kernel-source (535.x) for Debian 12's current default kernel (both resolved at run time from
the archive) into `<cache>/real-build/store`, through the same library function as
`nodeprep build-driver`. Later calls, in this run or later runs, are input-digest cache hits (no
compile). An flock on `<cache>/real-build/.lock` serialises concurrent callers (other test
sessions). The smoke test is left to the smoke tests themselves (smoke_test=False), so this build
costs one compile and no qemu boot.
"""

from __future__ import annotations

import fcntl
import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
SHARED = "debian12-proprietary"  # the name of ensure_real_build's build in docs/build.md's table


@dataclass(frozen=True)
class RealBuild:
    store: Path
    driver_version: str
    flavour: str
    kernel_release: str
    kmod: Path
    userspace: Path | None
    os_name: str
    cache: Path | None = None  # the nodeprep cache the build used (downloads, build root, apt lists)
    input_digest: str = ""
    compiled: bool = False  # True when this call compiled (first run on a fresh cache)


def real_build_request(cache: Path):  # type: ignore[no-untyped-def]
    """The BuildRequest of the shared build (its driver resolved from the archive now)."""
    from nodeprep import targets
    from nodeprep.builder.resolve import BuildRequest
    from nodeprep.sources.debian import DebianArchive

    archive = DebianArchive(cache, os_name="debian-12")
    versions = archive.versions("nvidia-kernel-source")
    if not versions:
        raise RuntimeError("Debian 12's archive serves no nvidia-kernel-source")
    from nodeprep.sources.drivers import debian_version_to_driver

    return BuildRequest(
        driver=debian_version_to_driver(versions[0]),
        flavour="proprietary",
        target=targets.get("debian-12"),
        kernel=None,
        store=cache / "real-build" / "store",
        cache=cache,
        userspace=True,
        smoke_test=False,
    ), archive


def ensure_real_build(cache: Path) -> RealBuild:
    """Build (once per cache) or find the shared real build; see the module docstring."""
    cache = Path(cache)
    return _locked_build(cache, SHARED, lambda: real_build_request(cache))


def _locked_build(cache: Path, cell: str, request) -> RealBuild:  # type: ignore[no-untyped-def]
    """Under the cell's flock: `request()` -> (BuildRequest, archive or None), build it, and record
    the compile time for docs/build.md's support table when this call compiled."""
    from nodeprep.builder.driver import build_driver

    from .supporttable import cell_dir, record_build

    base = cell_dir(cache, cell)
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        req, archive = request()
        result = build_driver(req, archive=archive)
        if result.compiled:
            record_build(cache, cell, make_s=result.timings.get("make", 0.0), total_s=result.duration_s,
                         jobs=req.jobs or os.cpu_count() or 1)
    m = result.manifest
    assert m.kernel_release and m.flavour
    return RealBuild(store=req.store, driver_version=m.driver_version, flavour=m.flavour,
                     kernel_release=m.kernel_release, kmod=result.artifact, userspace=result.userspace,
                     os_name=m.os, cache=cache, input_digest=result.input_digest, compiled=result.compiled)


# The new cells of issue 13, each built once per cache into its own store (same flock discipline).
CELLS = {
    # Trixie's datacenter branch (nvidia-tesla-535, 535.274.02) for its newest kernel. Trixie's
    # 550.163.01, open and proprietary alike, builds for no kernel trixie serves any more: 6.12.107
    # and later changed pci_resize_resource() (a new argument), which its nv-pci.c does not know
    # ("too few arguments to function 'pci_resize_resource'"), and 6.12.94, the newest it built
    # against (this cell's kernel until 2026-11), has left the archive. 535.274.02 handles it.
    "debian13-tesla": dict(
        driver="535.274.02", flavour="proprietary", os_name="debian-13", kernel="6.12.117+deb13-amd64"
    ),
    # Not Debian 12's current default kernel: 6.1.0-53 (6.1.187) and later carry the backported
    # pci_resize_resource() change, which 535.261.03's open nv-pci.c does not know ("too few
    # arguments to function 'pci_resize_resource'", first run of this cell on 6.1.0-56);
    # 6.1.0-50 (6.1.176) is the newest bookworm kernel it builds against.
    "debian12-open": dict(
        driver="535.261.03", flavour="open", os_name="debian-12", kernel="6.1.0-50-amd64"
    ),
    # The newest bookworm-backports kernel: the backports driver sources (~bpo12) build for it.
    "debian12-backports": dict(
        driver="535.216.03", flavour="proprietary", os_name="debian-12", kernel="6.12.117+deb12-amd64"
    ),
    # Debian experimental's 555 (issue 27): its driver sources and user space, bookworm's build root
    # and kernel. 6.1.0-50 as for debian12-open: 555.58.02 predates the pci_resize_resource() change
    # of 6.1.0-53 and later.
    "debian12-experimental": dict(
        driver="555.58.02", flavour="proprietary", os_name="debian-12", kernel="6.1.0-50-amd64",
        driver_suite="experimental",
    ),
}


# Cells built from NVIDIA's open-gpu-kernel-modules releases (`--open-source`, issue 27), found
# through NODEPREP_NVIDIA_OPEN (`.ci/run` points it at the shared releases; without it they skip).
OPEN_ENV = "NODEPREP_NVIDIA_OPEN"
OPEN_RELEASES = {  # version -> sha256 of open-gpu-kernel-modules-<version>.tar.gz (git archive of the tag)
    "580.142": "644c8cea8ed92414c7bd4567f200d6f5ed10868728d7f7fb0f06b01319330343",
    "595.45.04": "dcec5996ed6f01eddbfd1c316383774e2f504501060218b1d898d04be6af0aa0",
}
OPEN_SOURCE_CELLS = {
    # Debian 12's current default kernel (6.1.0-56, whose headers and image the shared build and
    # the smoke tests already hold): 580.142 builds for it, pci_resize_resource() change and all.
    "debian12-open-580": dict(release="580.142", os_name="debian-12", kernel="6.1.0-56-amd64"),
    # Debian 13's newest 6.12 kernel (its headers are the debian13-tesla cell's), 580.142 again.
    "debian13-open-580": dict(release="580.142", os_name="debian-13", kernel="6.12.117+deb13-amd64"),
    # The newest release of the snapshot for the newest kernel it builds for: not trixie-backports'
    # 7.x (its nv-linux.h includes <linux/of_gpio.h>, which 7.2 and later removed: seen compiling it
    # for 7.3.4+deb13 on 2026-11-26, make failed after 13.5 min; nodeprep.targets.limits refuses it
    # there), so trixie's own 6.12.117, whose headers the other Debian 13 cells share.
    "debian13-open-595": dict(release="595.45.04", os_name="debian-13", kernel="6.12.117+deb13-amd64"),
}


def open_release(version: str) -> tuple[Path, str] | str:
    """(path of the release tarball of `version`, its sha256), or why it is not available."""
    where = os.environ.get(OPEN_ENV)
    if not where:
        return (f"{OPEN_ENV} is not set: it names a directory with open-gpu-kernel-modules-<version>.tar.gz "
                "releases (.ci/run points it at the shared ones)")
    path = Path(where) / f"open-gpu-kernel-modules-{version}.tar.gz"
    if not path.is_file():
        return f"{OPEN_ENV}={where} has no {path.name}"
    return path, OPEN_RELEASES[version]


def open_source_request(cache: Path, cell: str):  # type: ignore[no-untyped-def]
    """The BuildRequest of open-source `cell`: with the smoke boot, into `<cache>/real-build-<cell>/store`."""
    from nodeprep import targets
    from nodeprep.builder.resolve import BuildRequest

    spec = OPEN_SOURCE_CELLS[cell]
    found = open_release(spec["release"])
    if isinstance(found, str):
        raise RuntimeError(found)
    path, sha = found
    return BuildRequest(flavour="open", target=targets.get(spec["os_name"]), kernel=spec["kernel"],
                        open_source=str(path), open_source_sha256=sha,
                        store=Path(cache) / f"real-build-{cell}" / "store", cache=Path(cache),
                        userspace=False, smoke_test=True)


def ensure_open_source_cell(cache: Path, cell: str) -> RealBuild:
    """Build (once per cache) or find the real build of open-source `cell` (see OPEN_SOURCE_CELLS)."""
    return _locked_build(Path(cache), cell, lambda: (open_source_request(cache, cell), None))


def cell_spec(cell: str) -> dict[str, str | None]:
    """OS, kernel, driver and flavour of `cell`: one of CELLS, or SHARED (newest driver, default kernel)."""
    if cell == SHARED:
        return dict(driver=None, flavour="proprietary", os_name="debian-12", kernel=None)
    return dict(CELLS[cell])


def cell_request(cache: Path, cell: str, *, userspace: bool = False):  # type: ignore[no-untyped-def]
    """The BuildRequest of `cell` (see CELLS): no smoke test, into `<cache>/real-build-<cell>/store`."""
    from nodeprep import targets
    from nodeprep.builder.resolve import BuildRequest

    spec = dict(CELLS[cell])
    target = targets.get(str(spec.pop("os_name")))
    store = Path(cache) / f"real-build-{cell}" / "store"
    return BuildRequest(**spec, target=target, store=store, cache=Path(cache),  # type: ignore[arg-type]
                        userspace=userspace, smoke_test=False)


def ensure_cell(cache: Path, cell: str, *, userspace: bool = False) -> RealBuild:
    """Build (once per cache) or find the real build of `cell` (see CELLS)."""
    return _locked_build(Path(cache), cell, lambda: (cell_request(cache, cell, userspace=userspace), None))


# The GPUDirect companions (issue 39) built beside the shared build's driver: the same request plus
# nvidia-fs and gdrdrv from NODEPREP_NVIDIA_COMPANIONS, signed with `key`/`cert`, smoke-tested, into
# `<cache>/real-build-debian12-gpudirect/store`. The driver is a compile-cache hit of the shared build
# (same tree, headers and build root): only the companions compile, once per cache.
GPUDIRECT = "debian12-gpudirect"
COMPANION_ARCHIVES = {"nvidia-fs": "gds-nvidia-fs-2.28.4.tar.gz", "gdrdrv": "gdrcopy-2.6.tar.gz"}


def ensure_gpudirect_build(cache: Path, key: Path, cert: Path):  # type: ignore[no-untyped-def]
    """(the BuildResult, the companions' seconds of make when this call compiled them, else None); a
    RuntimeError naming what is missing when the companion archives are not at hand."""
    import dataclasses

    from nodeprep.builder.driver import build_driver

    from . import companions
    from .supporttable import cell_dir, record_companions

    found = {name: companions.archive(file) for name, file in COMPANION_ARCHIVES.items()}
    missing = [str(p) for p in found.values() if isinstance(p, str)]
    if missing:
        raise RuntimeError(missing[0])
    ensure_real_build(cache)
    base = cell_dir(cache, GPUDIRECT)
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        req, archive = real_build_request(cache)
        req = dataclasses.replace(
            req, store=base / "store", userspace=False, smoke_test=True, sign_key=key, sign_cert=cert,
            companions=tuple((n, str(p), companions.ARCHIVES[COMPANION_ARCHIVES[n]])
                             for n, p in found.items()))
        result = build_driver(req, archive=archive)
        made = result.timings.get("companions_make")
        if made is not None:
            record_companions(cache, SHARED, make_s=made, jobs=req.jobs or os.cpu_count() or 1)
    return result, made
