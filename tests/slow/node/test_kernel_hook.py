"""A new kernel never boots without its driver: Debian's own kernel packages installed with apt-get
inside a Debian 12 rootfs (chroot) run nodeprep's /etc/kernel/postinst.d hook.

Real throughout: the rootfs is mmdebstrap's (cached tarball, with the kernel packages' dependencies
and nodeprep's Python dependencies), nodeprep goes in as the nodeprep_install role puts it there (the
role's zipapp unpacked under /usr/local/lib/nodeprep/lib, its wrapper on PATH), the driver is the
slow tier's shared real build (535.x for Debian 12's current kernel K) installed by `nodeprep install
--root`, the kernel packages are Debian's linux-image debs (K, and J: another Debian 12 kernel the
archive serves) installed from the test cache with the rootfs's own apt, and J's modules are small
real modules compiled against J's headers (tests/slow/node/helpers.py). No boot: the GRUB default
is checked in the file the hook writes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from nodeprep import artifact
from nodeprep.node.kernelhook import HOLD_FILE, LOUD
from nodeprep.node.layout import UNIT_NAME
from nodeprep.node.state import load_state
from nodeprep.sources.debian import DebianArchive
from tests.support.testhosts import debian_rootfs

from .helpers import REPO, V_NEW, NodeStore, build_stub_kmod, cli, run

pytestmark = pytest.mark.slow

KERNEL_DEPS = ("linux-base", "initramfs-tools")  # linux-image-*'s Depends besides kmod
CHROOT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
              "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C.UTF-8", "HOME": "/root"}
ZIPAPP = REPO / "collections/ansible_collections/nodeprep/fleet/plugins/module_utils/nodeprep_zipapp.py"


def other_kernel(archive: DebianArchive, current: str) -> str:
    """Another Debian 12 amd64 kernel ABI the archive serves (linux-image-amd64's other version)."""
    for version in archive.versions("linux-image-amd64"):
        m = re.search(r"linux-image-(\S+-amd64)", archive.info("linux-image-amd64", version)["Depends"])
        if m and m.group(1) != current:
            return m.group(1)
    pytest.fail(f"the Debian 12 archive serves no kernel besides {current}")


def put_nodeprep(root: Path, lib: str = "usr/local/lib/nodeprep", wrapper: bool = True) -> None:
    """The nodeprep_install role's result: its zipapp unpacked into /usr/local/lib/nodeprep/lib and
    the wrapper /usr/local/bin/nodeprep (the role's own build function and wrapper text). `lib` and
    no `wrapper`: a nodeprep somewhere off the node's PATH (a venv, a build checkout)."""
    spec = importlib.util.spec_from_file_location("nodeprep_zipapp", ZIPAPP)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    data, _ = mod.build(str(REPO), [], "/usr/bin/python3")
    pyz = root / lib / "nodeprep.pyz"
    pyz.parent.mkdir(parents=True, exist_ok=True)
    pyz.write_bytes(data)
    with zipfile.ZipFile(pyz) as zf:
        zf.extractall(pyz.parent / "lib")
    if wrapper:
        path = root / "usr/local/bin/nodeprep"
        path.write_text('#!/bin/sh\nexec /usr/bin/python3 /usr/local/lib/nodeprep/lib "$@"\n')
        path.chmod(0o755)


def chroot(root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["chroot", str(root), *argv], capture_output=True, text=True, env=CHROOT_ENV,
                          timeout=900)


def apt(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    r = chroot(root, "apt-get", "-y", "--no-install-recommends", "-o", "Dpkg::Use-Pty=0", *args)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def publish(store: artifact.LocalStore, path: Path) -> None:
    store.publish(path, artifact.read_manifest(path))


@pytest.fixture
def bare_kernel_root(test_cache: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A Debian 12 rootfs without nodeprep, /proc mounted (unmounted again, also on failure)."""
    root = debian_rootfs(test_cache, tmp_path / "root", KERNEL_DEPS)
    conf = root / "etc/initramfs-tools/conf.d/nodeprep-test.conf"
    conf.write_text("MODULES=list\n")  # a small initramfs: the test boots nothing
    run(["mount", "-t", "proc", "proc", root / "proc"])
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root / "proc")], check=False)


@pytest.fixture
def kernel_root(bare_kernel_root: Path) -> Path:
    """A Debian 12 rootfs with nodeprep on its PATH and /proc mounted."""
    put_nodeprep(bare_kernel_root)
    return bare_kernel_root


def test_what_a_live_install_writes_runs_the_nodes_own_nodeprep(
    node_store: NodeStore, bare_kernel_root: Path  # type: ignore[no-untyped-def]
) -> None:
    """A live install (inside the chroot, root /) run by a nodeprep off the node's PATH (a venv or a
    checkout): it says the node lacks nodeprep; once nodeprep is upgraded into place and the copy that
    ran the install is gone, the kernel hooks and the unit run the node's own nodeprep. (The live
    install does not activate: the chroot runs this machine's kernel; activation is `--root`'s.)"""
    root, version, kernel = bare_kernel_root, V_NEW, node_store.kernel
    shutil.copytree(node_store.path, root / "srv/nodeprep-store")
    put_nodeprep(root, lib="opt/build-checkout", wrapper=False)
    r = chroot(root, "/usr/bin/python3", "/opt/build-checkout/lib", "install", "--store",
               "/srv/nodeprep-store", "--driver", version, "--kernel", kernel)
    assert r.returncode == 0, r.stderr
    said = [ln for ln in r.stderr.splitlines() if "has no `nodeprep` on its PATH" in ln]
    assert len(said) == 1 and said[0].startswith("warning: this node has no"), r.stderr
    r = cli("activate", version, "--kernel", kernel, "--root", str(root), "--no-load")
    assert r.returncode == 0, r.stderr

    shutil.rmtree(root / "opt/build-checkout")  # the checkout moves on; nodeprep is installed properly
    put_nodeprep(root)
    (root / "lib/modules" / kernel / "kernel").mkdir(parents=True, exist_ok=True)  # the kernel package
    out = chroot(root, "/etc/kernel/postinst.d/nodeprep", kernel, f"/boot/vmlinuz-{kernel}")
    assert out.returncode == 0 and out.stderr.strip() == \
        f"nodeprep kernel hook: {version} already has modules for {kernel}", out.stderr
    unit = (root / "etc/systemd/system" / UNIT_NAME).read_text()
    exec_start = next(ln.split("=", 1)[1] for ln in unit.splitlines() if ln.startswith("ExecStart="))
    r = chroot(root, *exec_start.split(), "--help")  # what systemd would start, found in the root
    assert r.returncode == 0 and "load-modules" in r.stdout, r.stderr

    shutil.rmtree(root / "lib/modules" / kernel)  # the kernel package is purged
    out = chroot(root, "/etc/kernel/postrm.d/nodeprep", kernel, f"/boot/vmlinuz-{kernel}")
    assert f"removed the NVIDIA modules of kernel {kernel}" in out.stderr, out.stderr
    assert load_state(root).installed[version].kernels == ()


def test_kernel_packages_get_their_modules_or_keep_the_boot_default(
    real_build, test_cache: Path, kernel_root: Path, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    root = kernel_root
    version, k_new = real_build.driver_version, real_build.kernel_release
    archive = DebianArchive(test_cache)
    k_other = other_kernel(archive, k_new)
    debs = root / "var/cache/nodeprep-test-debs"
    debs.mkdir(parents=True)
    for k in (k_new, k_other):
        shutil.copy(archive.download(f"linux-image-{k}"), debs)
    deb = {k: f"/var/cache/nodeprep-test-debs/{next(debs.glob(f'linux-image-{k}_*.deb')).name}"
           for k in (k_new, k_other)}
    # the store lives in the node (the hook reads it from there); it lacks k_other for now
    store = artifact.LocalStore(root / "srv/nodeprep-store")
    for e in artifact.LocalStore(real_build.store).entries():
        if e.driver_version == version and e.kernel_release in (None, k_new):
            publish(store, real_build.store / e.name)

    r = cli("install", "--store", str(store.path), "--driver", version, "--kernel", k_new,
            "--root", str(root), "--activate", "--keep-boot-kernel")
    assert r.returncode == 0, r.stderr
    hook = root / "etc/kernel/postinst.d/nodeprep"
    assert os.access(hook, os.X_OK) and (root / "etc/kernel/postrm.d/nodeprep").is_file()
    recorded = json.loads((root / "var/lib/nodeprep/state.json").read_text())["kernel_hook"]
    assert recorded["store"] == "/srv/nodeprep-store" and recorded["keep_boot_kernel"] is True

    # 1. the kernel the driver was built for: the hook finds its modules in place
    out = apt(root, "install", deb[k_new])
    assert f"{version} already has modules for {k_new}" in out.stderr + out.stdout

    # 2. a kernel the store has no modules for: one loud line, apt succeeds, the boot default stays
    out = apt(root, "install", deb[k_other])
    said = [ln for ln in (out.stdout + out.stderr).splitlines() if LOUD in ln]
    assert len(said) == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"{LOUD} {k_other}: driver {version}: the store's kmod artifacts are built for kernel " \
        f"{k_new}" in said[0]
    assert f"boot default kept on {k_new}" in said[0]
    status = chroot(root, "dpkg-query", "-W", "-f=${Status}", f"linux-image-{k_other}").stdout
    assert status == "install ok installed"
    hold = (root / HOLD_FILE).read_text()
    title = f"Advanced options for Debian GNU/Linux>Debian GNU/Linux, with Linux {k_new}"
    assert f"GRUB_DEFAULT='{title}'" in hold
    assert k_other not in load_state(root).installed[version].kernels
    assert not (root / "lib/modules" / k_other / "updates/nodeprep").exists()

    # 3. the store gets k_other's modules; the package's postinst runs again (reinstall): installed
    km, _ = build_stub_kmod(archive, test_cache / "node", version, tmp_path / "built", release=k_other)
    publish(store, km)
    out = apt(root, "install", "--reinstall", deb[k_other])
    assert f"installed the NVIDIA {version} modules for kernel {k_other}" in out.stdout + out.stderr
    assert not (root / HOLD_FILE).exists()
    assert load_state(root).installed[version].kernels == tuple(sorted((k_new, k_other)))
    link = f"/lib/modules/{k_other}/updates/nodeprep/nvidia.ko"
    assert chroot(root, "readlink", "-f", link).stdout.strip() == \
        f"/opt/nvidia/{version}/modules/{k_other}/nvidia.ko"
    assert chroot(root, "modinfo", "-F", "vermagic", link).stdout.split()[0] == k_other
    assert "updates/nodeprep/nvidia.ko:" in (root / "lib/modules" / k_other / "modules.dep").read_text()
    resolved = chroot(root, "modprobe", "-S", k_other, "--show-depends", "nvidia").stdout
    assert f"/lib/modules/{k_other}/updates/nodeprep/nvidia.ko" in resolved

    # 4. the kernel package is purged: nodeprep's modules and links for it go too
    apt(root, "purge", f"linux-image-{k_other}")
    assert not (root / "opt/nvidia" / version / "modules" / k_other).exists()
    assert not (root / "lib/modules" / k_other / "updates/nodeprep").exists()
    assert load_state(root).installed[version].kernels == (k_new,)
    assert (root / "lib/modules" / k_new / "updates/nodeprep/nvidia.ko").is_symlink()

    # run by hand (or by a broken caller) for a kernel that is not installed: one line, exit 2
    r = chroot(root, "nodeprep", "kernel-hook", "postinst", "6.1.0-999-amd64")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "error: kernel 6.1.0-999-amd64: not installed under / (no /lib/modules/6.1.0-999-amd64/kernel); "
        "the hook takes the release of an installed kernel"]
