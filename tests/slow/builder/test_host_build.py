"""`build-driver --builder host` for real: kbuild against kernel headers installed on "this system".

The system is a minimal Debian 12 rootfs (tests/support/testhosts.py, plus gcc-12, make, libc6-dev,
binutils, libelf1, libssl3) with Debian's real linux-headers-<rel>, linux-headers-<abi>-common and
linux-kbuild-<series> packages (from the test cache, through DebianArchive) installed at their real
paths: their Makefile includes /usr/src/linux-headers-<abi>-common/Makefile and /lib/modules/<rel>/build
is an absolute link, so the headers only work where they were installed. nodeprep (this repository,
bind-mounted read-only at /src) runs in it with chroot, exactly as it would inside a builder
container or on a build host. The driver source is a tiny one-file module packed as a real makeself
.run, so the compile takes seconds. No stand-ins: real gcc, real kbuild, real modinfo.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from nodeprep import artifact, runner
from nodeprep.builder import headers
from tests.support.makeself import make_runfile

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
BUILD_PACKAGES = ("gcc-12", "make", "libc6-dev", "binutils", "libelf1", "libssl3")
# NVIDIA's Makefile takes the headers from SYSOUT (and SYSSRC) when given; so does this one.
TINY_MAKEFILE = """\
KERNEL_UNAME ?= $(shell uname -r)
SYSOUT ?= /lib/modules/$(KERNEL_UNAME)/build
modules:
\t$(MAKE) -C $(SYSOUT) M=$(CURDIR) modules
"""
TINY_C = """\
#include <linux/module.h>
#include <linux/init.h>
static int __init nv_init(void) { return 0; }
static void __exit nv_exit(void) { }
module_init(nv_init);
module_exit(nv_exit);
MODULE_LICENSE("GPL");
MODULE_VERSION("%s");
"""


def tiny_runfile(dest_dir: Path, version: str) -> Path:
    work = Path(tempfile.mkdtemp(dir=dest_dir.parent))
    pkg = work / f"NVIDIA-Linux-x86_64-{version}"
    (pkg / "kernel" / "nvidia").mkdir(parents=True)
    (pkg / "kernel" / "Makefile").write_text(TINY_MAKEFILE)
    (pkg / "kernel" / "Kbuild").write_text("obj-m := nvidia.o\nnvidia-y := nvidia/nv.o\n")
    (pkg / "kernel" / "nvidia" / "nv.c").write_text(TINY_C % version)
    run = make_runfile(pkg, dest_dir / f"NVIDIA-Linux-x86_64-{version}.run", compression="gzip")
    shutil.rmtree(work)
    return run


@pytest.fixture
def system(test_cache: Path, tmp_path: Path):
    """A Debian 12 system with one kernel's headers installed; yields (root, kernel release)."""
    from nodeprep.sources.debian import DebianArchive
    from tests.support.testhosts import debian_rootfs

    archive = DebianArchive(test_cache, os_name="debian-12")
    archive.update()
    hdrs = headers.resolve(archive, None)
    root = debian_rootfs(test_cache, tmp_path / "root", BUILD_PACKAGES)
    for pkg, ver in hdrs.packages:
        stage = Path(tempfile.mkdtemp(dir=tmp_path))
        runner.run(["dpkg-deb", "-x", archive.download(pkg, ver), stage])
        headers.install_into(stage, root)  # merged /usr, as dpkg would unpack it
        shutil.rmtree(stage)
    mounts = []
    try:
        for src, dest, opts in (("/dev", "dev", ["--bind"]), ("proc", "proc", ["-t", "proc"])):
            runner.run(["mount", *opts, src, root / dest])
            mounts.append(root / dest)
        (root / "src").mkdir()
        runner.run(["mount", "--bind", REPO, root / "src"])
        mounts.append(root / "src")
        runner.run(["mount", "-o", "remount,bind,ro", root / "src"])
        (root / "work").mkdir()
        yield root, hdrs.release
    finally:
        for m in reversed(mounts):
            runner.run(["umount", "-l", m], check=False)
        shutil.rmtree(root, ignore_errors=True)


def build_in(root: Path, *args: str):  # type: ignore[no-untyped-def]
    """`nodeprep build-driver --builder host` run inside `root` (chroot) from the read-only checkout at
    /src, with store and cache under /work; `args` add to it."""
    return runner.run(
        [
            "python3",
            "-m",
            "nodeprep.cli",
            "build-driver",
            "--builder",
            "host",
            "--store",
            "/work/store",
            "--cache",
            "/work/cache",
            *args,
        ],
        root=root,
        env={"PYTHONPATH": "/src"},
        check=False,
        timeout=900,
    )


def build(root: Path, *args: str) -> dict:
    res = build_in(root, "--no-userspace", "--no-smoke-test", "--json", *args)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def test_host_build_against_installed_headers(system, tmp_path):
    root, release = system
    run = tiny_runfile(root / "work", "999.02.01")
    sha = artifact.sha256_file(run)
    common = ["--os", "debian-12", "--runfile", f"/work/{run.name}", "--sha256", sha]
    hdir = f"/usr/src/linux-headers-{release}"

    first = build(root, *common, "--kernel", release, "--headers-dir", hdir)
    assert first["compiled"] is True and first["cached"] is False
    assert first["modules"] == ["nvidia.ko"] and first["os"] == "debian-12"
    assert first["compiler"].startswith("gcc-12 ")  # the kernel's CONFIG_CC_VERSION_TEXT
    out = tmp_path / "x"
    out.mkdir()
    manifest = artifact.extract(root / "work" / "store" / first["name"], out)
    ko = out / "modules" / release / "nvidia.ko"
    assert runner.run(["modinfo", "-F", "vermagic", ko]).stdout.startswith(release + " ")
    assert runner.run(["modinfo", "-F", "version", ko]).stdout.strip() == "999.02.01"
    assert manifest.os == "debian-12" and manifest.kernel_release == release
    assert manifest.extra["build_root"]["key"] == "host"
    assert manifest.extra["kernel_headers"]["dir"] == hdir
    assert manifest.inputs == {run.name: sha}  # no .debs: the headers are the system's
    assert manifest.extra["build"]["build_compiler"].startswith("gcc-12 (Debian 12.")
    # The work directory's path is mapped to the fixed build path in the module.
    assert b"/work/cache/tmp" not in ko.read_bytes()

    # Same inputs, headers found by discovery (/lib/modules/<rel>/build): a store hit.
    again = build(root, *common, "--kernel", release)
    assert again["cached"] is True and again["compiled"] is False
    assert again["input_digest"] == first["input_digest"] and again["sha256"] == first["sha256"]

    # Another headers tree (a copy with a changed Module.symvers) is another input.
    copy = root / "usr" / "src" / f"linux-headers-{release}.copy"
    runner.run(["cp", "-a", root / hdir.lstrip("/"), copy])
    with open(copy / "Module.symvers", "a") as f:
        f.write("0x00000000\tnodeprep_test_symbol\tvmlinux\tEXPORT_SYMBOL\t\n")
    changed = build(root, *common, "--headers-dir", f"/usr/src/{copy.name}")
    assert changed["input_digest"] != first["input_digest"]
    assert changed["compiled"] is True and changed["cached"] is False
    assert changed["kernel_release"] == release  # read from the copy's utsrelease.h
    assert not list((root / "work" / "cache" / "tmp").iterdir())


def test_host_build_refuses_a_missing_headers_tree(system):
    root, release = system
    res = build_in(
        root, "--os", "ubuntu-24.04", "--kernel", "6.8.0-45-generic", "--runfile", "/nonexistent.run",
        "--sha256", "0" * 64,
    )
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert lines[-1].startswith("error: --kernel: no headers for 6.8.0-45-generic on this system (tried ")
    assert "/usr/src/kernels/6.8.0-45-generic" in lines[-1]
    assert "Traceback" not in res.stderr
