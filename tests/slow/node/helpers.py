"""Helpers for the node tests. Real inputs, cached under test_cache/node/:

- a Debian 12 minbase rootfs made by mmdebstrap (tarball, unpacked per test) used as --root;
- user-space artifacts of two driver versions built with build_userspace from Debian's packages
  (535.309.01 mainline, 535.216.03 tesla-535);
- kmod-shaped artifacts: five small modules named like NVIDIA's, really compiled against the real
  Debian 12 kernel headers with MODULE_VERSION(<driver>), so vermagic/modinfo/depmod are real. The
  full NVIDIA module from the shared `real_build` fixture is used where the module itself matters
  (test_real_kmod.py); compiling it once per driver version here would take an hour.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from nodeprep import artifact
from nodeprep.sources.debian import DebianArchive

REPO = Path(__file__).resolve().parents[3]
V_NEW = "535.309.01"  # mainline packages
V_OLD = "535.216.03"  # tesla-535 packages
MODULES = ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm", "nvidia-peermem")
STUB = """#include <linux/module.h>
static int __init stub_init(void) { return 0; }
static void __exit stub_exit(void) {}
module_init(stub_init);
module_exit(stub_exit);
MODULE_LICENSE("Dual MIT/GPL");
MODULE_VERSION("%s");
MODULE_DESCRIPTION("nodeprep test stand-in named like NVIDIA's module");
"""


@dataclass(frozen=True)
class NodeStore:
    path: Path
    kernel: str
    vermagic: str


def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([os.fspath(a) for a in argv], check=True, capture_output=True, text=True, **kw)  # type: ignore[call-overload]


def _cli_env(env: dict[str, str] | None) -> dict[str, str]:
    """This environment minus any crash point, plus `env`, with the checkout on PYTHONPATH."""
    full_env = {k: v for k, v in os.environ.items() if k != "NODEPREP_CRASH_AT"}
    full_env.update({"PYTHONPATH": str(REPO), **(env or {})})
    return full_env


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a real `python -m nodeprep.cli` process (environment minus any crash point, plus `env`)."""
    return subprocess.run(
        [sys.executable, "-m", "nodeprep.cli", *args],
        capture_output=True,
        text=True,
        env=_cli_env(env),
        cwd=REPO,
        timeout=600,
    )


def install_cli(store: object, driver: str, kernel: str, root: Path, *extra: str,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`nodeprep install --store STORE --driver DRIVER --kernel KERNEL --root ROOT EXTRA...` via `cli`."""
    return cli("install", "--store", str(store), "--driver", driver, "--kernel", kernel, "--root", str(root),
               *extra, env=env)


def popen(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "nodeprep.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_cli_env(env),
        cwd=REPO,
    )


def _kernel_headers(
    archive: DebianArchive, dest: Path, release: str | None = None
) -> tuple[str, Path, dict[str, str]]:
    """Debian 12 amd64 kernel headers (the newest, or of `release`) unpacked under `dest`;
    (release, build dir, inputs)."""
    if release:
        pkg = f"linux-headers-{release}"
    else:
        meta = archive.info("linux-headers-amd64")
        pkg = re.search(r"linux-headers-\S+-amd64", meta["Depends"]).group(0)  # type: ignore[union-attr]
    release = pkg[len("linux-headers-") :]
    deps = archive.info(pkg)["Depends"]
    common = re.search(r"linux-headers-\S+-common", deps).group(0)  # type: ignore[union-attr]
    m = re.search(r"(linux-kbuild-[\d.]+)(?: \(= ([^)]+)\))?", deps)
    assert m, deps
    kbuild, kbuild_version = m.group(1), m.group(2)  # the headers' own kbuild (an older ABI's too)
    inputs = {}
    tree = dest / f"headers-{release}"
    if not (tree / ".done").exists():
        shutil.rmtree(tree, ignore_errors=True)
        for p in (pkg, common, kbuild):
            deb = archive.download(p, kbuild_version if p == kbuild else None)
            archive.extract(deb, tree)
        build = tree / "usr" / "src" / pkg
        mk = build / "Makefile"
        mk.write_text(mk.read_text().replace("include /usr/src/", f"include {tree}/usr/src/"))
        (tree / ".done").touch()
    for p in (pkg, common, kbuild):
        deb = archive.download(p, kbuild_version if p == kbuild else None)
        inputs[deb.name] = artifact.sha256_file(deb)
    return release, tree / "usr" / "src" / pkg, inputs


def build_stub_kmod(
    archive: DebianArchive, cache: Path, version: str, out: Path, release: str | None = None
) -> tuple[Path, artifact.Manifest]:
    """Stub modules of `version` compiled for the newest Debian 12 kernel (or `release`), packed."""
    release, build, inputs = _kernel_headers(archive, cache, release)
    src = cache / f"stub-{version}-{release}"
    if not (src / ".done").exists():
        shutil.rmtree(src, ignore_errors=True)
        src.mkdir()
        for m in MODULES:
            (src / f"{m.replace('-', '_')}.c").write_text(STUB % version)
        (src / "Kbuild").write_text(
            "obj-m := " + " ".join(f"{m.replace('-', '_')}.o" for m in MODULES) + "\n"
        )
        run(["make", "-C", build, f"M={src}", "modules"], timeout=900)
        (src / ".done").touch()
    payload = cache / f"stub-payload-{version}-{release}"
    shutil.rmtree(payload, ignore_errors=True)
    mdir = payload / "modules" / release
    mdir.mkdir(parents=True)
    for m in MODULES:
        shutil.copyfile(src / f"{m.replace('-', '_')}.ko", mdir / f"{m}.ko")
    vermagic = run(["modinfo", "-F", "vermagic", mdir / "nvidia.ko"]).stdout.strip()
    manifest = artifact.Manifest(
        kind="kmod",
        driver_version=version,
        arch="amd64",
        os="debian-12",
        flavour="proprietary",
        kernel_release=release,
        vermagic=vermagic,
        compiler="gcc-12",
        input_digest=artifact.input_digest(inputs, {"stub": version, "release": release}),
        inputs=inputs,
        extra={"test_stub": "small modules named like NVIDIA's (tests/slow/node/conftest.py)"},
    )
    return artifact.pack(payload, manifest, out)


def ldcache(root: Path) -> dict[str, str]:
    """soname -> path from `ldconfig -p` run inside the root (chroot)."""
    out = run(["chroot", root, "ldconfig", "-p"]).stdout
    entries: dict[str, str] = {}
    for line in out.splitlines()[1:]:
        if " => " in line:
            left, path = line.strip().rsplit(" => ", 1)
            entries.setdefault(left.split(" (")[0], path)
    return entries


def resolve(root: Path, path: str) -> str:
    """readlink -f inside the root."""
    return run(["chroot", root, "readlink", "-f", path]).stdout.strip()
