#!/usr/bin/env python3
"""Benchmark: node bring-up from user-data on a Debian 12 test rootfs, from a local store.

    python3 bench/bootstrap.py [--cache DIR] [--keep]

What runs (the same path as tests/slow/bootstrap/test_cloud_bootstrap.py):
  render    `nodeprep cloud-init` for a profile whose store is a local directory
  apply     cloud-init's own write_files (tests/slow/bootstrap/ci_apply.py) into the rootfs
  install   the first-boot installer in a chroot (wheel over loopback HTTP, sha256 checked, venv)
  bootstrap `nodeprep bootstrap --root` (join dry-run, GPU facts from a recorded nvidia-smi capture),
            with its per-step split from --json
  rerun     the same bootstrap again (every step already done)
Goal: bootstrap <= 60 s. Prints each phase, the split, and ratios measured in this one run.
Artifacts: the slow tier's shared real driver build (tests/support/realbuild.py; compiles once per cache).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchlib import Goals, cannot_measure, run, use_venv  # noqa: E402  (bench/benchlib.py, next to this file)

use_venv()

from nodeprep import runner  # noqa: E402
from tests.slow.bootstrap.test_cloud_bootstrap import (  # noqa: E402
    FIXTURE,
    ROOTFS_EXTRA,
    apply_user_data,
    build_wheel,
    nodeprep,
    stage_inputs,
    store_server,
    write_profile,
)
from tests.support.realbuild import ensure_real_build  # noqa: E402
from tests.support.testhosts import debian_rootfs  # noqa: E402

GOAL_S = 60.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path,
                    default=Path(os.environ.get("NODEPREP_TEST_CACHE", "/var/cache/nodeprep-tests")))
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    if os.geteuid() != 0:
        cannot_measure("bench/bootstrap.py needs root (chroot, rootfs ownership)")
    build = ensure_real_build(args.cache)
    work = Path(tempfile.mkdtemp(prefix="nodeprep-bench-bootstrap."))
    times: dict[str, float] = {}
    try:
        t = time.monotonic()
        root = debian_rootfs(args.cache, work / "root", extra_packages=ROOTFS_EXTRA)
        times["rootfs unpack (not part of the goal)"] = time.monotonic() - t
        wheel = build_wheel(work / "wheel")
        served, token = stage_inputs(work, wheel)
        with store_server(served) as url:
            # the node installs nodeprep over HTTP; the driver artifacts come from the local store dir
            profile = write_profile(work / "node.yaml", build, str(build.store))
            user_data = work / "user-data"
            t = time.monotonic()
            nodeprep("cloud-init", "--profile", profile, "--token-file", token, "--nodeprep-wheel", wheel,
                     "--out", user_data, check=True)
            times["render user-data"] = time.monotonic() - t
            t = time.monotonic()
            cfg = apply_user_data(user_data, root, work / "applied.json")["config"]
            times["apply write_files (cloud-init)"] = time.monotonic() - t
            install = list(cfg["runcmd"][0])
            # the store directory is not inside the chroot: the installer gets the wheel over loopback
            install[3] = f"{url}/tools/{wheel.name}"
            t = time.monotonic()
            runner.run(["chroot", root, *install], timeout=600, env={"no_proxy": "127.0.0.1"})
            times["install nodeprep (chroot)"] = time.monotonic() - t
        argv = ["bootstrap", "--root", root, "--profile", root / "etc/nodeprep/node.yaml", "--dry-run-join",
                "--nvidia-smi-xml", FIXTURE, "--json"]
        t = time.monotonic()
        first = nodeprep(*argv, check=True)
        boot = time.monotonic() - t
        t = time.monotonic()
        nodeprep(*argv, check=True)
        rerun = time.monotonic() - t
        steps = json.loads(first.stdout)["steps"]
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")

    print(f"driver {build.driver_version} ({build.flavour}) for kernel {build.kernel_release}, "
          f"store {build.store}")
    for name, secs in times.items():
        print(f"  {name:40s} {secs:7.2f} s")
    print(f"  {'bootstrap (process wall time)':40s} {boot:7.2f} s")
    for s in steps:
        print(f"    step {s['name']:33s} {s['seconds']:7.2f} s")
    print(f"  {'bootstrap rerun (dry-run join again)':40s} {rerun:7.2f} s")
    goals = Goals()
    verdict = goals.at_most(f"bootstrap <= {GOAL_S:.0f} s", boot, GOAL_S)
    print(f"bootstrap / goal {GOAL_S:.0f} s: {boot / GOAL_S:.3f}  ({verdict})")
    print(f"rerun / first bootstrap: {rerun / boot:.3f}")
    end_to_end = sum(v for k, v in times.items() if "not part" not in k) + boot
    print(f"user-data to ready node (render + apply + install + bootstrap): {end_to_end:.2f} s "
          f"({end_to_end / GOAL_S:.3f} of {GOAL_S:.0f} s)")
    return goals.exit_code()


if __name__ == "__main__":
    run(main)
