#!/usr/bin/env python3
"""Benchmark the qemu smoke test: wall time per kernel with a warm cache (goal <= 20 s, initramfs
included), split into kernel fetch (cache hit), initramfs build and boot.

With --artifact the kmod artifact's modules are tested (nvidia.ko is the expensive case: ~65 MB to
pack and for the emulated kernel to relocate); without it, each kernel's own vgem.ko stands in (an
in-tree module with in-kernel dependencies, the cheapest real case). The first run per kernel
downloads and extracts linux-image/linux-headers (printed as "cold"); the runs after it are warm.

    python3 bench/smoke.py [--artifact KMOD.tar.zst] [--kernel RELEASE ...] [--runs N] [--cache DIR]
"""

from __future__ import annotations

import argparse
import logging
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchlib import Goals, run, use_venv  # noqa: E402  (bench/benchlib.py, next to this file)

use_venv()

from nodeprep.artifact import extract, read_manifest  # noqa: E402
from nodeprep.builder.kernelfetch import fetch_kernel  # noqa: E402
from nodeprep.builder.smoke import smoke_test_modules  # noqa: E402
from nodeprep.sources.debian import DebianArchive  # noqa: E402

GOAL_S = 20.0


def newest_kernel(packages: Iterable[str]) -> str:
    """The newest release among linux-image-6.1.0-<ABI>-amd64 package names (ABI compared as a number)."""
    abi = {int(m.group(1)): m.group(0) for n in packages
           if (m := re.fullmatch(r"6\.1\.0-(\d+)-amd64", n.removeprefix("linux-image-")))}
    if not abi:
        raise SystemExit("no linux-image-6.1.0-<ABI>-amd64 package in the archive index")
    return abi[max(abi)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", type=Path, help="kmod artifact (default: each kernel's vgem.ko)")
    ap.add_argument("--kernel", action="append", default=[], help="kernel release (repeatable)")
    ap.add_argument("--runs", type=int, default=2, help="warm runs per kernel")
    ap.add_argument("--cache", type=Path, default=Path("/var/cache/nodeprep-tests"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    archive = DebianArchive(args.cache)
    kernels = list(args.kernel)
    if args.artifact and not kernels:
        kernels = [str(read_manifest(args.artifact).kernel_release)]
    if not kernels:
        kernels = [newest_kernel(archive.packages(r"^linux-image-6\.1\.0-[0-9]+-amd64$"))]

    print(f"{'kernel':<18} {'modules':<10} {'run':<5} {'fetch':>7} {'initramfs':>10} {'boot':>7} "
          f"{'total':>7} {'verdict':<7} goal {GOAL_S:.0f}s")
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for release in kernels:
            mod_dir = Path(tmp) / release
            mod_dir.mkdir()
            if args.artifact:
                extract(args.artifact, mod_dir)
                mod_dir = mod_dir / "modules" / str(read_manifest(args.artifact).kernel_release)
                what = "artifact"
            else:
                t0 = time.monotonic()
                kernel = fetch_kernel(release, archive=archive, cache=args.cache)
                print(f"{release:<18} {'-':<10} {'cold':<5} {time.monotonic() - t0:6.1f}s (fetch + extract)")
                vgem = next(kernel.modules_dir.rglob("vgem.ko*"))
                (mod_dir / vgem.name).write_bytes(vgem.read_bytes())
                what = "vgem"
            totals = []
            for run in range(args.runs + 1):
                r = smoke_test_modules(mod_dir, release, archive=archive, cache=args.cache)
                t = r.timings
                label = "cold" if run == 0 and t.get("fetch", 0) > 1 else f"warm{run}"
                if label.startswith("warm"):
                    totals.append(r.duration_s)
                print(f"{release:<18} {what:<10} {label:<5} {t.get('fetch', 0):6.1f}s "
                      f"{t.get('initramfs', 0):9.1f}s {t.get('boot', 0):6.1f}s {r.duration_s:6.1f}s "
                      f"{r.verdict:<7}")
            med = statistics.median(totals)
            worst = max(worst, med)
            print(f"{release:<18} {what:<10} median warm total {med:.1f}s = {med / GOAL_S:.2f} x goal")
    goals = Goals()
    verdict = goals.at_most(f"warm smoke test <= {GOAL_S:.0f} s", worst, GOAL_S)
    print(f"worst median: {worst:.1f}s (goal {GOAL_S:.0f}s)  {verdict}")
    return goals.exit_code()


if __name__ == "__main__":
    run(main)
