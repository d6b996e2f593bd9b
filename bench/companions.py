#!/usr/bin/env python3
"""Benchmark: the GPUDirect companions' compile (nvidia-fs, gdrdrv) beside the driver's own.

    python3 bench/companions.py [--cache DIR] [--jobs N] [--rounds N]

For the shared real build's cell (tests/support/realbuild.py: Debian 12's newest proprietary driver
for its current kernel), --rounds pairs, interleaved with the order alternating, on the same cached
build root and inputs:
  driver      a clone of the build root with headers and sources (not timed), then ONLY the driver's
              `make modules` (bench/benchlib.raw_make): the cell's compile
  companions  build_driver with --nvidia-fs/--gdrcopy, the driver a compile-cache hit and the
              companions' compile cache emptied first: their probes (gdrcopy's test scripts,
              gds-nvidia-fs's ./configure) and kbuild, as `companions_make` times them
Medians compared, each run's CPU seconds (its processes and their children) beside its wall time.
Goal: companions / driver <= 0.20 (issue 39: at most 20 % added to a cell's compile).
Needs the companion archives (NODEPREP_NVIDIA_COMPANIONS, tests/support/companions.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchlib import Goals, cannot_measure, children_cpu, raw_make, run, use_venv  # noqa: E402

use_venv()

GOAL = 0.20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("NODEPREP_TEST_CACHE",
                                                                       "/var/cache/nodeprep-tests")))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    if os.geteuid() != 0:
        cannot_measure("needs root (build roots are chroots)")
    from nodeprep.builder import driver
    from tests.support import companions
    from tests.support.realbuild import COMPANION_ARCHIVES, ensure_real_build, real_build_request

    found = {n: companions.archive(f) for n, f in COMPANION_ARCHIVES.items()}
    if any(isinstance(p, str) for p in found.values()):
        cannot_measure(next(str(p) for p in found.values() if isinstance(p, str)))
    ensure_real_build(args.cache)
    req, archive = real_build_request(args.cache)
    req = replace(req, jobs=args.jobs, userspace=False, smoke_test=False)
    plan, driver_make = raw_make(req, args.jobs)
    store = Path(tempfile.mkdtemp(prefix="bench-companions.", dir=args.cache / "tmp"))
    with_companions = replace(req, store=store, companions=tuple(
        (n, str(p), companions.ARCHIVES[COMPANION_ARCHIVES[n]]) for n, p in found.items()))

    def companions_make() -> tuple[float, float]:
        where = Path(tempfile.mkdtemp(dir=store))
        first = driver.build_driver(replace(with_companions, store=where / "a"), archive=archive)
        shutil.rmtree(args.cache / "kmod-builds" / first.manifest.extra["companions"]["compile_key"])
        c = children_cpu()
        t = time.process_time()
        result = driver.build_driver(replace(with_companions, store=where / "b"), archive=archive)
        if result.compiled:
            raise SystemExit("bench: the driver compiled again (no compile-cache hit): nothing measured")
        return result.timings["companions_make"], children_cpu() - c + time.process_time() - t

    print(f"driver {plan.driver_version} {plan.flavour} for {plan.kernel_release}, -j{args.jobs}, "
          f"{os.cpu_count()} CPUs")
    drv: list[tuple[float, float]] = []
    comp: list[tuple[float, float]] = []
    try:
        for i in range(args.rounds):
            for which in (("d", "c") if i % 2 == 0 else ("c", "d")):
                (drv if which == "d" else comp).append(driver_make() if which == "d" else companions_make())
    finally:
        shutil.rmtree(store, ignore_errors=True)
    d, c = statistics.median(w for w, _ in drv), statistics.median(w for w, _ in comp)
    goals = Goals()
    def runs(xs: list[tuple[float, float]]) -> str:
        return ", ".join(f"{w:.1f} s, CPU {u:.0f} s" for w, u in xs)

    print(f"driver make          {d:7.1f} s   (runs: {runs(drv)})")
    print(f"companions make      {c:7.1f} s   (runs: {runs(comp)})")
    ratio = c / d
    verdict = goals.at_most("companions <= 20 %", ratio, GOAL)
    print(f"ratio                {ratio:7.3f}     goal <= {GOAL:.2f}  {verdict}")
    return goals.exit_code()


if __name__ == "__main__":
    run(main)
