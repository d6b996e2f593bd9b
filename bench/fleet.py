#!/usr/bin/env python3
"""Benchmark: playbooks/site.yml wall time on 1 host vs 4 hosts, and the re-run (no change) time.

Runs real ansible-playbook over SSH against network-namespace test hosts (tests/support/testhosts.py)
with the shared real driver build as the artifact store, served over HTTP on the hosts' veths.
Goals: 4 hosts <= 2x one host (Ansible's forks make a fleet cost about one node), and a re-run
<= 40 % of the first run (every role checks before it writes). Needs root (namespaces, chroots).

    python3 bench/fleet.py [--hosts 1 4] [--connection ssh]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support import testhosts  # noqa: E402
from tests.support.realbuild import ensure_real_build  # noqa: E402


def measure(
    cache: Path, count: int, connection: str, store: Path, version: str, kernel: str
) -> tuple[float, float]:
    """(first run, re-run) seconds of site.yml against `count` fresh hosts."""
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        work = Path(tmp)
        source = work / "source"
        import shutil

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
            times = []
            for _ in range(2):
                start = time.monotonic()
                run = testhosts.ansible_playbook(fl, "playbooks/site.yml", inventory, connection=connection)
                times.append(time.monotonic() - start)
                if run.returncode != 0:
                    raise SystemExit(f"site.yml failed on {count} host(s):\n{run.output[-4000:]}")
            changed = {n: c["changed"] for n, c in run.recap.items()}
            if any(changed.values()):
                raise SystemExit(f"re-run on {count} host(s) changed something: {changed}")
    return times[0], times[1]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", type=int, nargs=2, default=[1, 4], metavar=("SMALL", "LARGE"))
    parser.add_argument("--connection", default="ssh", choices=["ssh", "paramiko"])
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("NODEPREP_TEST_CACHE", Path.home() / ".cache/nodeprep-tests")),
    )
    args = parser.parse_args()
    build = ensure_real_build(args.cache)
    small, large = args.hosts
    results = {}
    for count in (small, large):
        first, rerun = measure(
            args.cache, count, args.connection, build.store, build.driver_version, build.kernel_release
        )
        results[count] = (first, rerun)
        print(f"site.yml {count} host(s): first run {first:6.1f} s, re-run {rerun:6.1f} s", flush=True)
    (s_first, s_rerun), (l_first, l_rerun) = results[small], results[large]
    print(f"{large} hosts / {small} host, first run: {l_first / s_first:.2f}x   (goal <= 2.00x)")
    print(f"re-run / first run, {small} host:  {s_rerun / s_first:.0%}   (goal <= 40%)")
    print(f"re-run / first run, {large} hosts: {l_rerun / l_first:.0%}   (goal <= 40%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
