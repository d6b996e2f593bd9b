"""The new real cells installed on nodes of their own OS: a Debian 13 (trixie) root gets the
debian-13 artifacts (tesla-535) and its own ldconfig and `nodeprep doctor --root` resolve into the versioned
root; a Debian 12 root booted on a bookworm-backports kernel gets the backports artifact, and the 6.1
build is refused there. The roots are real (mmdebstrap minbase, cached as tarballs); the kernels'
module trees are Debian's own packages (the smoke tier's kernel cache)."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest

from nodeprep import artifact
from nodeprep.builder.kernelfetch import fetch_kernel
from nodeprep.sources.debian import DebianArchive
from tests.support.realbuild import ensure_cell, ensure_real_build

from .helpers import cli, ldcache, resolve, run

pytestmark = pytest.mark.slow


def unpack(tar: Path, dest: Path) -> Path:
    dest.mkdir()
    with tarfile.open(tar) as t:
        t.extractall(dest, filter="fully_trusted")
    return dest


def store_of(tmp_path: Path, *builds) -> Path:  # type: ignore[no-untyped-def]
    """A store holding the kmod and user-space artifacts of `builds`."""
    store = artifact.LocalStore(tmp_path / "store")
    for b in builds:
        for p in (b.kmod, b.userspace):
            store.publish(Path(p), artifact.read_manifest(Path(p)))
    return store.path


def boot_kernel(root: Path, release: str, cache: Path, os_name: str) -> None:
    """Put Debian's own module tree of `release` into the root, as installing its linux-image did."""
    kernel = fetch_kernel(release, archive=DebianArchive(cache, os_name=os_name, kernel=release), cache=cache)
    shutil.copytree(kernel.modules_dir, root / "lib" / "modules" / release, symlinks=True)


def install(store: Path, root: Path, driver: str, kernel: str) -> object:
    return cli("install", "--store", str(store), "--driver", driver, "--kernel", kernel, "--root", str(root),
               "--activate", "--json")


def test_trixie_root_gets_the_debian13_artifacts(
    test_cache: Path, trixie_tar: Path, tmp_path: Path
) -> None:
    cell = ensure_cell(test_cache, "debian13-tesla", userspace=True)
    version, rel = cell.driver_version, cell.kernel_release
    root = unpack(trixie_tar, tmp_path / "root")
    assert "trixie" in (root / "etc" / "os-release").read_text()
    boot_kernel(root, rel, test_cache, "debian-13")
    r = install(store_of(tmp_path, cell), root, version, rel)
    assert r.returncode == 0, r.stderr  # type: ignore[attr-defined]
    assert json.loads(r.stdout)["installed_kmod"] is True  # type: ignore[attr-defined]

    ko = f"/lib/modules/{rel}/updates/nodeprep/nvidia.ko"
    assert resolve(root, ko) == f"/opt/nvidia/{version}/modules/{rel}/nvidia.ko"
    assert run(["modinfo", "-F", "license", root / ko.lstrip("/")]).stdout.strip() == "NVIDIA"
    assert run(["modinfo", "-F", "vermagic", root / ko.lstrip("/")]).stdout.split()[0] == rel
    # trixie's own ldconfig (in the root) resolves the driver's libraries into the versioned root
    cache = ldcache(root)
    for soname in ("libcuda.so.1", "libnvidia-ml.so.1"):
        assert resolve(root, cache[soname]).startswith(f"/opt/nvidia/{version}/"), (soname, cache[soname])
    d = cli("doctor", "--root", str(root), "--check", "state", "--check", "ldcache", "--json")
    assert d.returncode == 0, d.stdout + d.stderr
    report = json.loads(d.stdout)
    assert report["ok"] is True, report
    assert version in json.dumps(report)


def test_backports_kernel_root_gets_the_backports_artifact(
    test_cache: Path, rootfs: Path, tmp_path: Path
) -> None:
    bpo = ensure_cell(test_cache, "debian12-backports", userspace=True)
    mainline = ensure_real_build(test_cache)  # 535.309.01 for the 6.1 kernel
    rel = bpo.kernel_release
    assert rel.endswith("+deb12-amd64") and mainline.kernel_release.startswith("6.1.0-")
    boot_kernel(rootfs, rel, test_cache, "debian-12")
    store = store_of(tmp_path, bpo, mainline)

    refused = install(store, rootfs, mainline.driver_version, rel)
    assert refused.returncode == 2, refused.stderr  # type: ignore[attr-defined]
    assert mainline.kernel_release in refused.stderr and rel in refused.stderr  # type: ignore[attr-defined]
    assert not (rootfs / "opt" / "nvidia" / mainline.driver_version).exists()

    r = install(store, rootfs, bpo.driver_version, rel)
    assert r.returncode == 0, r.stderr  # type: ignore[attr-defined]
    ko = rootfs / "lib" / "modules" / rel / "updates" / "nodeprep" / "nvidia.ko"
    assert run(["modinfo", "-F", "vermagic", ko]).stdout.split()[0] == rel
    assert run(["modinfo", "-F", "version", ko]).stdout.strip() == bpo.driver_version == "535.216.03"
    assert not (rootfs / "lib" / "modules" / mainline.kernel_release / "updates" / "nodeprep").exists()
    # the kernel's own module tree and ours form one graph (depmod over the backports tree)
    dep = (rootfs / "lib" / "modules" / rel / "modules.dep").read_text().splitlines()
    drm = next(x for x in dep if x.startswith("updates/nodeprep/nvidia-drm.ko:"))
    assert "updates/nodeprep/nvidia.ko" in drm and "kernel/drivers/gpu/drm/" in drm, drm


def test_debian12_root_gets_the_open_modules(test_cache: Path, rootfs: Path, tmp_path: Path) -> None:
    cell = ensure_cell(test_cache, "debian12-open", userspace=True)
    version, rel = cell.driver_version, cell.kernel_release
    boot_kernel(rootfs, rel, test_cache, "debian-12")
    r = cli("install", "--store", str(store_of(tmp_path, cell)), "--driver", version, "--flavour", "open",
            "--kernel", rel, "--root", str(rootfs), "--activate", "--json")
    assert r.returncode == 0, r.stderr
    ko = rootfs / "lib" / "modules" / rel / "updates" / "nodeprep" / "nvidia.ko"
    assert run(["modinfo", "-F", "license", ko]).stdout.strip() == "Dual MIT/GPL"
    assert run(["modinfo", "-F", "version", ko]).stdout.strip() == version == "535.261.03"
    assert resolve(rootfs, ldcache(rootfs)["libcuda.so.1"]).startswith(f"/opt/nvidia/{version}/")
    d = cli("doctor", "--root", str(rootfs), "--check", "state", "--check", "ldcache", "--json")
    assert d.returncode == 0 and json.loads(d.stdout)["ok"] is True, d.stdout + d.stderr


def h200_sysfs(root: Path) -> None:
    """ROOT/sys/bus/pci/devices with one H200 SXM (10de:2335, subsystem 10de:18be) and a non-GPU."""
    base = root / "sys" / "bus" / "pci" / "devices"
    for name, attrs in (("0000:1b:00.0", {"vendor": "0x10de", "device": "0x2335", "class": "0x030200",
                                          "subsystem_vendor": "0x10de", "subsystem_device": "0x18be"}),
                        ("0000:06:00.0", {"vendor": "0x15b3", "device": "0x101d", "class": "0x020000"})):
        (base / name).mkdir(parents=True)
        for k, v in attrs.items():
            (base / name / k).write_text(v + "\n")


def test_debian12_root_with_an_h200_gets_experimentals_555(test_cache: Path, rootfs: Path,
                                                           tmp_path: Path) -> None:
    """Issue 27 items 3 and 4: a store with the open 535.261.03 cell and Debian experimental's 555.58.02
    for 6.1.0-50; `install --gpus node` on a root whose PCI tree holds an H200 picks 555.58.02 (535's
    list does not name the H200) and the proprietary flavour, installs and activates it; doctor's
    state, ldcache and support checks pass on it."""
    exp = ensure_cell(test_cache, "debian12-experimental", userspace=True)
    old = ensure_cell(test_cache, "debian12-open", userspace=True)
    assert exp.kernel_release == old.kernel_release == "6.1.0-50-amd64"
    rel = exp.kernel_release
    boot_kernel(rootfs, rel, test_cache, "debian-12")
    h200_sysfs(rootfs)
    r = cli("install", "--store", str(store_of(tmp_path, exp, old)), "--gpus", "node", "--kernel", rel,
            "--root", str(rootfs), "--activate", "--no-load", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["version"] == "555.58.02"
    ko = rootfs / "lib" / "modules" / rel / "updates" / "nodeprep" / "nvidia.ko"
    assert run(["modinfo", "-F", "version", ko]).stdout.strip() == "555.58.02"
    assert run(["modinfo", "-F", "license", ko]).stdout.strip() == "NVIDIA"
    assert resolve(rootfs, ldcache(rootfs)["libcuda.so.1"]).startswith("/opt/nvidia/555.58.02/")
    assert (rootfs / "opt" / "nvidia" / "555.58.02" / "share" / "supported-gpus.json").is_file()
    d = cli("doctor", "--root", str(rootfs), "--check", "state", "--check", "ldcache", "--check", "support",
            "--json")
    report = json.loads(d.stdout)
    assert d.returncode == 0 and report["ok"] is True, d.stdout + d.stderr
    (support,) = [c for c in report["checks"] if c["name"] == "support"]
    assert support["message"].startswith("555.58.02 supports the node's 1 NVIDIA GPU(s)"), support
