#!/usr/bin/env python3
"""Benchmark reading a node profile with 50,000 list items (issue 18: parsing looked quadratic).

For each shape, `load_profile` (nodeprep's reader: libyaml's parser, the limit-checking composer,
validation) is timed side by side with PyYAML's pure-Python `yaml.safe_load` of the same text (what
profiles were read with before). Goal: every shape in <= 1 s. Profiles are generated in a temp dir.

    .venv/bin/python bench/profile.py [--items N] [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchlib import Goals, run, use_venv  # noqa: E402  (bench/benchlib.py, next to this file)

use_venv()

import yaml  # noqa: E402

from nodeprep.errors import ProfileError  # noqa: E402
from nodeprep.profile import load_profile  # noqa: E402

GOAL_S = 1.0
HEAD = 'driver:\n  version: "550.90.07"\n'


def shapes(n: int) -> dict[str, str]:
    return {
        # duplicates: refused, but only after the whole list was checked (was quadratic: list.count)
        "driver.modules (duplicates)": HEAD + "  modules:\n" + "  - nvidia\n" * n,
        "runtime.cdi_spec_dirs": HEAD + "runtime:\n  cdi_spec_dirs:\n"
        + "".join(f"  - /c/{i}\n" for i in range(n)),
        "cluster.taints (flow list)": HEAD + 'cluster:\n  api_server: "10.0.0.1:6443"\n  taints: ['
        + ", ".join(f"t{i}:NoExecute" for i in range(n)) + "]\n",
        "labels.extra": HEAD + "labels:\n  extra:\n" + "".join(f'    e.io/l{i}: "v"\n' for i in range(n)),
    }


def timed(fn: object, runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=50_000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    goals = Goals()
    print(f"{'shape':32} {'bytes':>9} {'nodeprep':>9} {'pyyaml-py':>10} {'ratio':>6}  goal <= {GOAL_S:.1f} s")
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in shapes(args.items).items():
            path = Path(tmp) / "node.yaml"
            path.write_text(text)

            def ours(path: Path = path) -> None:
                try:
                    load_profile(path)
                except ProfileError:
                    pass

            ours_s = timed(ours, args.runs)
            theirs_s = timed(lambda text=text: yaml.load(text, Loader=yaml.SafeLoader), 1)
            verdict = goals.at_most(name, ours_s, GOAL_S)
            print(f"{name:32} {len(text):9d} {ours_s:8.3f}s {theirs_s:9.3f}s {theirs_s / ours_s:5.1f}x  "
                  f"{verdict}")
    return goals.exit_code()


if __name__ == "__main__":
    run(main)
