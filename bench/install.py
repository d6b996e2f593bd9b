#!/usr/bin/env python3
"""Benchmark: installing a prebuilt driver on a node vs compiling it there, and the switch time.

    python3 bench/install.py [--cache DIR] [--jobs N] [--compile-seconds S]

In one run, on a fresh Debian 12 minbase root (mmdebstrap, cached) used as --root:
  install   `nodeprep install --activate` of the shared real build (tests/support/realbuild.py: the
            real proprietary kmod + user space from Debian's packages, in a local store) as a fresh
            process: verify, unpack, ldconfig, module links, depmod, unit
  compile   the raw `make modules` of the same driver for the same kernel in a prepared clone of the
            build root (what a node would at least pay to build it itself; downloads, headers and
            the build root excluded), measured here unless --compile-seconds gives a number already
            measured by bench/build.py on this machine
  switch    activate of a second installed version and rollback, each as a fresh process and as a
            library call (the second version: Debian's 535.216.03 tesla user space with a small
            kmod-shaped artifact from tests/slow/node, switching does not touch module contents)
Goals: compile / install >= 25, switch and rollback <= 1 s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchlib import Goals, raw_make, run, use_venv  # noqa: E402  (bench/benchlib.py, next to this file)

use_venv()

from nodeprep import artifact, runner  # noqa: E402
from nodeprep.join.activation import CALLBACKS  # noqa: E402
from nodeprep.node import switch  # noqa: E402


def cli(*args: str) -> float:
    t = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "nodeprep.cli", "-q", *args],
        check=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    return time.monotonic() - t


def raw_compile(cache: Path, driver_version: str, kernel: str, jobs: int) -> float:
    """Only `make modules` of the driver in a clone of the build engineer's cached build root."""
    from nodeprep.builder.resolve import BuildRequest

    req = BuildRequest(
        driver=driver_version,
        kernel=kernel,
        store=cache / "real-build" / "store",
        cache=cache,
        jobs=jobs,
        userspace=False,
        smoke_test=False,
    )
    wall, _ = raw_make(req, jobs)[1]()
    return wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--cache", type=Path, default=Path(os.environ.get("NODEPREP_TEST_CACHE", "/var/cache/nodeprep-tests"))
    )
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument(
        "--compile-seconds",
        type=float,
        default=None,
        help="raw make time already measured (bench/build.py) instead of compiling here",
    )
    args = ap.parse_args()

    from nodeprep.builder.userspace import build_userspace
    from nodeprep.sources.debian import DebianArchive
    from tests.slow.node.helpers import V_OLD, build_stub_kmod
    from tests.support.realbuild import ensure_real_build

    print("setup: the shared real build (cache hit when built before)", flush=True)
    real = ensure_real_build(args.cache)
    node_cache = args.cache / "node"
    node_cache.mkdir(parents=True, exist_ok=True)
    rootfs_tar = node_cache / "debian12-minbase.tar"
    if not rootfs_tar.exists():
        runner.run(["mmdebstrap", "--quiet", "--variant=minbase", "bookworm", rootfs_tar], timeout=1800)
    archive = DebianArchive(args.cache)
    work = Path(tempfile.mkdtemp(prefix="bench-install."))
    try:
        second = artifact.LocalStore(work / "store2")
        us, usm = build_userspace(archive, V_OLD, node_cache / "artifacts")
        second.publish(us, usm)
        km, kmm = build_stub_kmod(archive, node_cache, V_OLD, node_cache / "artifacts")
        if kmm.kernel_release != real.kernel_release:
            print(
                f"note: second version's kmod is for {kmm.kernel_release}, the real build's for "
                f"{real.kernel_release}; switching is timed with --root only"
            )
        second.publish(km, kmm)

        first = artifact.LocalStore(work / "store1")  # the real kmod + its user space
        first.publish(real.kmod, artifact.read_manifest(real.kmod))
        if real.userspace is not None:
            first.publish(real.userspace, artifact.read_manifest(real.userspace))
        else:
            us1, us1m = build_userspace(archive, real.driver_version, node_cache / "artifacts")
            first.publish(us1, us1m)

        root = work / "root"
        root.mkdir()
        with tarfile.open(rootfs_tar) as t:
            t.extractall(root, filter="fully_trusted")
        sizes = sum(e.size for e in first.entries())

        print(
            f"install: {real.driver_version} ({sizes / 1e6:.0f} MB of artifacts) into a fresh root",
            flush=True,
        )
        install_s = cli(
            "install",
            "--store",
            str(first.path),
            "--driver",
            real.driver_version,
            "--kernel",
            real.kernel_release,
            "--root",
            str(root),
            "--activate",
        )
        cli(
            "install",
            "--store",
            str(second.path),
            "--driver",
            V_OLD,
            "--kernel",
            str(kmm.kernel_release),
            "--root",
            str(root),
        )

        switch_cli = cli("activate", V_OLD, "--root", str(root))
        rollback_cli = cli("rollback", "--root", str(root))
        t = time.monotonic()
        switch.activate(root, V_OLD, callbacks=CALLBACKS)
        switch_lib = time.monotonic() - t
        t = time.monotonic()
        switch.rollback(root, callbacks=CALLBACKS)
        rollback_lib = time.monotonic() - t

        if args.compile_seconds is not None:
            compile_s, how = args.compile_seconds, "given (--compile-seconds)"
        else:
            print(
                f"compile: raw make of {real.driver_version} for {real.kernel_release}, -j{args.jobs}",
                flush=True,
            )
            compile_s, how = (
                raw_compile(args.cache, real.driver_version, real.kernel_release, args.jobs),
                "measured",
            )

        print()
        print(
            f"driver {real.driver_version} {real.flavour} for {real.kernel_release}; "
            f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
        )
        print(f"install+activate  {install_s:8.2f} s   (fresh process, local store)")
        print(f"raw compile       {compile_s:8.1f} s   ({how}, -j{args.jobs})")
        ratio = compile_s / install_s
        goals = Goals()
        verdict = goals.at_least("compile/install >= 25x", ratio, 25)
        print(f"ratio             {ratio:8.1f} x   goal >= 25x  {verdict}")
        for name, cli_s, lib_s in (
            ("switch", switch_cli, switch_lib),
            ("rollback", rollback_cli, rollback_lib),
        ):
            verdict = goals.check(f"{name} <= 1 s", cli_s <= 1 or lib_s <= 1)
            if verdict == "OK" and cli_s > 1:
                verdict = "OK (library)"
            print(
                f"{name:9}         {cli_s:8.2f} s   (process; library call {lib_s:.2f} s)  "
                f"goal <= 1 s  {verdict}"
            )
        return goals.exit_code()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    run(main)
