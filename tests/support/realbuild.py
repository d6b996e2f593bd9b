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
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


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
    from nodeprep.build.driver import BuildRequest
    from nodeprep.sources.debian import DebianArchive

    archive = DebianArchive(cache, os_name="debian-12")
    versions = archive.versions("nvidia-kernel-source")
    if not versions:
        raise RuntimeError("Debian 12's archive serves no nvidia-kernel-source")
    from nodeprep.sources.drivers import debian_version_to_driver

    return BuildRequest(
        driver=debian_version_to_driver(versions[0]),
        flavour="proprietary",
        os_name="debian-12",
        kernel=None,
        store=cache / "real-build" / "store",
        cache=cache,
        userspace=True,
        smoke_test=False,
    ), archive


def ensure_real_build(cache: Path) -> RealBuild:
    """Build (once per cache) or find the shared real build; see the module docstring."""
    from nodeprep.build.driver import build_driver

    cache = Path(cache)
    lock_path = cache / "real-build" / ".lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        req, archive = real_build_request(cache)
        result = build_driver(req, archive=archive)
    m = result.manifest
    assert m.kernel_release and m.flavour
    return RealBuild(
        store=req.store,
        driver_version=m.driver_version,
        flavour=m.flavour,
        kernel_release=m.kernel_release,
        kmod=result.artifact,
        userspace=result.userspace,
        os_name=m.os,
        cache=cache,
        input_digest=result.input_digest,
        compiled=result.compiled,
    )


# The new cells of issue 13, each built once per cache into its own store (same flock discipline).
CELLS = {
    # Not trixie's current default kernel: 6.12.107 and later changed pci_resize_resource() (a new
    # argument), which 550.163.01's nv-pci.c does not know ("too few arguments to function
    # 'pci_resize_resource'"); 6.12.94 is the newest trixie kernel it builds against.
    "debian13-open": dict(
        driver="550.163.01", flavour="open", os_name="debian-13", kernel="6.12.94+deb13-amd64"
    ),
}


def ensure_cell(cache: Path, cell: str, *, userspace: bool = False) -> RealBuild:
    """Build (once per cache) or find the real build of `cell` (see CELLS): the OS's current
    default kernel from its archive, no smoke test, into `<cache>/real-build-<cell>/store`."""
    from nodeprep.build.driver import BuildRequest, build_driver

    cache = Path(cache)
    base = cache / f"real-build-{cell}"
    base.mkdir(parents=True, exist_ok=True)
    req = BuildRequest(**CELLS[cell], store=base / "store", cache=cache, userspace=userspace,
                       smoke_test=False)  # type: ignore[arg-type]
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = build_driver(req)
    m = result.manifest
    assert m.kernel_release and m.flavour
    return RealBuild(store=req.store, driver_version=m.driver_version, flavour=m.flavour,
                     kernel_release=m.kernel_release, kmod=result.artifact, userspace=result.userspace,
                     os_name=m.os, cache=cache, input_digest=result.input_digest, compiled=result.compiled)
