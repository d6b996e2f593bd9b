#!/usr/bin/env python3
"""Benchmark: playbooks/site.yml wall time on 1 host vs 4 hosts, and the re-run (no change) time.

Runs real ansible-playbook over SSH against network-namespace test hosts (tests/support/testhosts.py)
with the shared real driver build as the artifact store, served over HTTP on the hosts' veths.
Goal: 4 hosts <= 2x one host (Ansible's forks make a fleet cost about one node). The re-run ratio
is printed for information; its goal (<= 40 % of the first run) was retired in issue 16.
Needs root (namespaces, chroots).

Each host count is measured on --repeat fresh fleets (a first run, then --reruns re-runs each) and
the medians are compared, all in this one process, one after the other. The CPU line says how busy
the machine's cores were: the test hosts share them with the controller, so a 4-host run that keeps
every core busy measures this machine's cores as much as Ansible's parallelism.

    python3 bench/fleet.py [--hosts 1 4] [--connection ssh] [--repeat 3] [--reruns 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchlib import Goals, run, use_venv  # noqa: E402  (bench/benchlib.py, next to this file)

use_venv()

from tests.support import testhosts  # noqa: E402
from tests.support.realbuild import ensure_real_build  # noqa: E402


def busy_and_total() -> tuple[float, float]:
    """(busy, busy + idle + iowait) CPU seconds of the whole machine so far, from /proc/stat."""
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]  # user nice system irq softirq steal
    return busy / tick, (busy + v[3] + v[4]) / tick


@dataclass
class Runs:
    first: list[float] = field(default_factory=list)
    rerun: list[float] = field(default_factory=list)
    first_cpu: list[float] = field(default_factory=list)  # share of all cores busy during first runs


def timed_run(fl, inventory: Path, connection: str) -> tuple[float, float, testhosts.PlaybookRun]:  # type: ignore[no-untyped-def]
    b0, t0 = busy_and_total()
    start = time.monotonic()
    run = testhosts.ansible_playbook(fl, "playbooks/site.yml", inventory, connection=connection)
    wall = time.monotonic() - start
    b1, t1 = busy_and_total()
    return wall, (b1 - b0) / max(t1 - t0, 1e-9), run


def measure(
    cache: Path, count: int, connection: str, store: Path, version: str, kernel: str, reruns: int, out: Runs
) -> None:
    """One fresh fleet of `count` hosts: a first run of site.yml, then `reruns` no-change re-runs."""
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        work = Path(tmp)
        source = work / "source"
        shutil.copytree(REPO / "nodeprep", source / "nodeprep", ignore=shutil.ignore_patterns("__pycache__"))
        with testhosts.fleet(cache, work, count) as fl, testhosts.serve_directory(store, fl) as urls:
            for host in fl.hosts:
                testhosts.prepare_host(host)
            inventory = testhosts.write_inventory(
                fl,
                work / "inventory.yml",
                testhosts.fleet_vars(work, source, version, kernel),
                {h.name: {"nvidia_driver_store": urls[h.name]} for h in fl.hosts},
            )
            for i in range(1 + reruns):
                wall, busy, run = timed_run(fl, inventory, connection)
                if run.returncode != 0:
                    raise SystemExit(f"site.yml failed on {count} host(s):\n{run.output[-4000:]}")
                if i == 0:
                    out.first.append(wall)
                    out.first_cpu.append(busy)
                    continue
                changed = {n: c["changed"] for n, c in run.recap.items()}
                if any(changed.values()):
                    raise SystemExit(f"re-run on {count} host(s) changed something: {changed}")
                out.rerun.append(wall)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", type=int, nargs=2, default=[1, 4], metavar=("SMALL", "LARGE"))
    parser.add_argument("--connection", default="ssh", choices=["ssh", "paramiko"])
    parser.add_argument("--repeat", type=int, default=3, help="fresh fleets per host count (default 3)")
    parser.add_argument("--reruns", type=int, default=2, help="re-runs per fleet (default 2)")
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("NODEPREP_TEST_CACHE", Path.home() / ".cache/nodeprep-tests")),
    )
    args = parser.parse_args()
    if args.repeat < 1 or args.reruns < 1:
        parser.error("--repeat and --reruns must be at least 1")
    build = ensure_real_build(args.cache)
    small, large = args.hosts
    results: dict[int, Runs] = {small: Runs(), large: Runs()}
    for _ in range(args.repeat):  # interleaved, so a slow spell of the machine hits both sizes
        for count in (small, large):
            measure(
                args.cache, count, args.connection, build.store, build.driver_version,
                build.kernel_release, args.reruns, results[count],
            )
    med = {n: (statistics.median(r.first), statistics.median(r.rerun)) for n, r in results.items()}
    cores = os.cpu_count() or 1
    for count in (small, large):
        r = results[count]
        print(
            f"site.yml {count} host(s): first run {med[count][0]:6.1f} s, re-run {med[count][1]:6.1f} s "
            f"(medians of {len(r.first)} and {len(r.rerun)}; first runs kept "
            f"{statistics.median(r.first_cpu):.0%} of the {cores} cores busy)",
            flush=True,
        )
    (s_first, s_rerun), (l_first, l_rerun) = med[small], med[large]
    goals = Goals()
    scale = goals.at_most(f"{large} hosts <= 2x {small}", l_first / s_first, 2.0)
    print(f"{large} hosts / {small} host, first run: {l_first / s_first:.2f}x   (goal <= 2.00x)  {scale}")
    for count, first, rerun in ((small, s_first, s_rerun), (large, l_first, l_rerun)):  # no goal (issue 16)
        print(f"re-run / first run, {count} host(s): {rerun / first:.0%}   (for information)")
    return goals.exit_code()


if __name__ == "__main__":
    run(main)
