#!/usr/bin/env python3
"""Benchmark: what persistenced and Fabric Manager add to a node's bootstrap (issue 39).

    python3 bench/daemons.py [--rounds N]

Side by side in one run, each a fresh process or call, the median of N rounds:
  condition  `nodeprep fabric-manager --condition` on an HGX H100 sysfs tree (tests/support/hgxsysfs.py):
             what the Fabric Manager unit's ExecCondition costs at boot, beside `nodeprep --version`
             (the CLI's own start) for reference
  selftest   `verify-gpus` through NVIDIA's NVML mock (HGX H100: persistence and fabric read, fabric
             COMPLETED, no wait) beside `verify-gpus` from a recorded nvidia-smi capture (no NVML)
  units      writing nodeprep-persistenced.service and nodeprep-fabricmanager.service (+ wants links)
             into a fresh root, as activation does (library calls)
Goal: condition + (selftest - capture) + units <= 5 s. What the daemons themselves take to start
(nvidia-persistenced, nv-fabricmanager on real NVSwitches) needs the hardware: not measured here.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchlib import Goals, cannot_measure, run, use_venv  # noqa: E402  (bench/benchlib.py)

use_venv()

from nodeprep.node import integration  # noqa: E402
from nodeprep.node.layout import Layout  # noqa: E402
from tests.support import hgxsysfs, mocknvml  # noqa: E402

CAPTURE = REPO / "tests/fixtures/nvidia-smi/dual-rtx-a5000_590.44.01.xml"


def timed(argv: list[str], env: dict[str, str]) -> float:
    t = time.monotonic()
    subprocess.run(argv, env=env, capture_output=True, check=False, cwd=REPO)
    return time.monotonic() - t


def median(rounds: int, f) -> float:  # type: ignore[no-untyped-def]
    return statistics.median(f() for _ in range(rounds))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if mocknvml.skip_reason():
        cannot_measure(str(mocknvml.skip_reason()))
    cli = [sys.executable, "-m", "nodeprep.cli"]
    base = {"PATH": os.environ.get("PATH", ""), "LC_ALL": "C", "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryDirectory(prefix="bench-daemons-") as tmp:
        work = Path(tmp)
        sysfs = hgxsysfs.hgx_h100(work / "sys", driver="550.163.01")
        cond = median(args.rounds, lambda: timed([*cli, "fabric-manager", "--sysfs-root", str(sysfs),
                                                  "--condition"], base))
        bare = median(args.rounds, lambda: timed([*cli, "--version"], base))
        root = work / "root"
        (root / "opt/nvidia/550.163.01").mkdir(parents=True)
        (root / "opt/nvidia/550.163.01/manifest.json").write_text("{}")
        (root / "opt/nvidia/current").symlink_to("550.163.01")
        env = mocknvml.env(work / "cache", "h100", base)
        verify = [*cli, "verify-gpus", "--root", str(root), "--sysfs-root", str(sysfs)]
        nvml = median(args.rounds, lambda: timed(verify, env))
        capture = median(args.rounds, lambda: timed([*verify, "--nvidia-smi-xml", str(CAPTURE)], base))

        def units() -> float:
            r = Path(tempfile.mkdtemp(dir=work))
            t = time.monotonic()
            integration.write_persistenced_unit(Layout(r))
            integration.write_fabricmanager_unit(Layout(r))
            return time.monotonic() - t
        written = median(args.rounds, units)
    added = cond + max(0.0, nvml - capture) + written
    goals = Goals()
    print(f"condition  {cond:6.3f} s   (nodeprep --version {bare:.3f} s)")
    print(f"selftest   {nvml:6.3f} s   through NVML (mock H100), {capture:.3f} s from a capture: "
          f"+{nvml - capture:.3f} s")
    print(f"units      {written * 1000:6.2f} ms")
    print(f"added      {added:6.3f} s   goal <= 5 s: {goals.at_most('added', added, 5.0)}")
    return goals.exit_code()


if __name__ == "__main__":
    run(main)
