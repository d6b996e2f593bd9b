#!/usr/bin/env python3
"""Simulation: the wall time of a driver rollout over a fleet (default 7,500 nodes) from per-node step
times, for batch sizes 1 %, 5 %, 25 % and failure rates 0 %, 1 %, 5 %, with the failure budget.

    python3 bench/fleet_upgrade.py [--nodes N] [--failure-budget N] [--forks N] [--cache DIR] [--no-measure]

Per-node step times, measured in this run where they can be (each a fresh `nodeprep` process):
  install   `nodeprep install --activate --no-load` of the shared real build (real proprietary kmod +
            user space, tests/support/realbuild.py's store in the test cache) into an empty --root
  revert    `nodeprep upgrade revert` back to a second installed version (what a failed node costs)
  selftest  `nodeprep verify-gpus` over a recorded nvidia-smi capture (the node's self-test itself)
  cluster   `nodeprep upgrade prepare` + `finish --no-selftest` of one node with a GPU pod and a CPU
            pod on a real kube-apiserver 1.24 (tests/support/controlplane.py), when NODEPREP_K8S_BIN
            names its binaries
Not measurable here (no GPU, no nvidia module for this kernel), given as options: the module reload
(--reload-seconds), the GPU pods' own stop time (--grace-seconds, Kubernetes' default grace period),
the verdict's way to the taint (--verify-interval: verify-nodes' pass interval, half of it on
average), the reboot of nodes whose modules are held (--reboot-rate, --reboot-seconds).

The rollout: the batches come from nodeprep.upgrade.policy.plan (the playbook's plan), Ansible's
linear strategy runs each step on every node of a batch, `--forks` at a time, before the next step,
and after each batch nodeprep.upgrade.policy.budget_spent decides whether the rollout pauses. A node
fails (seeded, independently, at the failure rate) at validation: it has installed, reloaded and
tested, then reverts. Goals: every rollout without failures completes, and every rollout with a
budget pauses after the first batch whose failures reach it, having upgraded exactly the nodes of
the batches before (checked against the simulated failures, not against the planner).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchlib import Goals, run, use_venv  # noqa: E402  (bench/benchlib.py, next to this file)

use_venv()

from nodeprep.upgrade import policy  # noqa: E402
from nodeprep.upgrade.states import NodeView  # noqa: E402

CAPTURE = REPO / "tests/fixtures/nvidia-smi/tesla-t4_515.105.01.xml"
BATCHES = ("1%", "5%", "25%")
RATES = (0.0, 0.01, 0.05)


@dataclass
class Steps:
    """Seconds per node and step, and where each number comes from."""

    install: float
    revert: float
    selftest: float
    cluster: float
    reload: float
    grace: float
    verify_wait: float
    reboot_rate: float
    reboot: float
    source: dict[str, str]


def nodeprep(*args: str) -> float:
    t = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "nodeprep", "-q", *args], check=True, cwd=REPO, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.monotonic() - t


def measure_node(cache: Path, work: Path) -> tuple[float, float, float]:
    """install (beside an older version), revert and self-test seconds (fresh processes)."""
    import json

    store = cache / "real-build" / "store"
    if not (store / "index.json").is_file():
        raise SystemExit(f"no shared real build at {store} (the slow tier's realbuild makes it)")
    index = json.loads((store / "index.json").read_text())
    kmod = next(a for a in index["artifacts"] if a.get("kind") == "kmod")
    version, kernel = kmod["driver_version"], kmod["kernel_release"]
    from tests.support.standin import standin_store

    old = "535.216.03"  # the version installed before: a small stand-in for the same kernel
    old_store = standin_store(work / "standin", work / "old-store", old, (kernel,))
    root = work / "root"
    root.mkdir()

    def activate(source: Path, driver: str) -> float:
        return nodeprep("install", "--store", str(source), "--driver", driver, "--kernel", kernel, "--root",
                        str(root), "--activate", "--no-load", "--node-store", str(source))

    activate(old_store, old)
    install = activate(store, version)  # the upgrade: the new version installed beside the old one
    revert = nodeprep("upgrade", "revert", "--root", str(root), "--version", version, "--no-load")
    sysfs, proc = work / "sys", work / "sroot"
    (sysfs / "module/nvidia").mkdir(parents=True)
    (sysfs / "module/nvidia/version").write_text("515.105.01\n")
    d = sysfs / "bus/pci/devices/0000:00:1e.0"
    d.mkdir(parents=True)
    (d / "vendor").write_text("0x10de\n")
    (d / "class").write_text("0x030200\n")
    (proc / "opt/nvidia/515.105.01").mkdir(parents=True)
    (proc / "opt/nvidia/515.105.01/manifest.json").write_text("{}")
    (proc / "opt/nvidia/current").symlink_to("515.105.01")
    selftest = nodeprep(
        "verify-gpus", "--root", str(proc), "--sysfs-root", str(sysfs), "--nvidia-smi-xml", str(CAPTURE)
    )
    return install, revert, selftest


def measure_cluster(cache: Path, work: Path) -> float | None:
    """prepare + finish of one node with a GPU and a CPU pod on a real API server; None without one."""
    from tests.support import controlplane as cpmod

    if cpmod.skip_reason():
        return None
    from tests.slow.upgrade.test_rollout_apiserver import make_node, make_pod, rollout_credential

    with cpmod.control_plane(work / "cp", cache) as cp:
        conf = rollout_credential(cp)
        times = []
        for i in range(3):
            name = f"bench-{i}"
            make_node(cp, name)
            make_pod(cp, name, f"{name}-gpu", gpu=True)
            make_pod(cp, name, f"{name}-cpu", gpu=False)
            common = ["--kubeconfig", str(conf), "--node", name, "--version", "550.1"]
            times.append(
                nodeprep("upgrade", "prepare", *common)
                + nodeprep("upgrade", "finish", *common, "--no-selftest")
            )
        return sorted(times)[1]


@dataclass
class Outcome:
    wall: float
    batches_run: int
    batches: int
    upgraded: int
    failed: int
    paused: str | None
    expected_pause_batch: int | None


def node_seconds(s: Steps, rng: random.Random, failed: bool) -> list[float]:
    """Seconds of each linear-strategy step for one node: prepare (+ the GPU pods' grace), install,
    reload or reboot, self-test and the verdict's wait, finish (or revert)."""
    jitter = lambda: rng.lognormvariate(0.0, 0.1)  # noqa: E731
    reload = s.reboot if rng.random() < s.reboot_rate else s.reload
    tail = s.revert * jitter() if failed else 0.0
    return [
        s.cluster / 2 + s.grace,
        s.install * jitter(),
        reload * jitter(),
        s.selftest + s.verify_wait,
        s.cluster / 2 + tail,
    ]


def simulate(n: int, batch: str, rate: float, budget: int, forks: int, s: Steps, seed: int = 1) -> Outcome:
    rng = random.Random(f"{seed}-{batch}-{rate}")
    views = [NodeView(f"gpu-{i:05d}", None, None, None, False, False) for i in range(n)]
    plan = policy.plan(views, "550.163.01", batch=batch, max_unavailable="25%", failure_budget=budget)
    fails = {name for b in plan.batches for name in b if rng.random() < rate}
    wall, upgraded, failed, paused = 0.0, 0, [], None
    # independently of the planner: the first batch at which the failures reach the budget
    expected, count = None, 0
    for i, b in enumerate(plan.batches):
        count += sum(1 for name in b if name in fails)
        if count >= budget:
            expected = i + 1
            break
    ran = 0
    for b in plan.batches:
        ran += 1
        per_node = [node_seconds(s, rng, name in fails) for name in b]
        waves = math.ceil(len(b) / max(1, forks))
        for step in range(len(per_node[0])):
            wall += waves * max(t[step] for t in per_node)
        failed += [name for name in b if name in fails]
        upgraded += sum(1 for name in b if name not in fails)
        paused = policy.budget_spent(failed, budget)
        if paused:
            break
    return Outcome(wall, ran, len(plan.batches), upgraded, len(failed), paused, expected)


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=7500)
    ap.add_argument("--failure-budget", type=int, default=50, help="nodes (default 50)")
    ap.add_argument(
        "--forks",
        type=int,
        default=25,
        help="Ansible forks (ansible.cfg: 25); the table also shows forks as large as the batch",
    )
    ap.add_argument(
        "--cache", type=Path, default=Path(os.environ.get("NODEPREP_TEST_CACHE", "/var/cache/nodeprep-tests"))
    )
    ap.add_argument("--no-measure", action="store_true", help="use the --*-seconds values for every step")
    ap.add_argument("--install-seconds", type=float, default=8.0)
    ap.add_argument("--revert-seconds", type=float, default=1.0)
    ap.add_argument("--selftest-seconds", type=float, default=0.5)
    ap.add_argument("--cluster-seconds", type=float, default=2.0)
    ap.add_argument(
        "--reload-seconds",
        type=float,
        default=20.0,
        help="unload + load of the nvidia modules with the GPUs' init (not measurable here)",
    )
    ap.add_argument(
        "--grace-seconds", type=float, default=30.0, help="GPU pods' stop time (Kubernetes' default)"
    )
    ap.add_argument("--verify-interval", type=float, default=15.0, help="verify-nodes' pass interval")
    ap.add_argument("--reboot-rate", type=float, default=0.0, help="share of nodes whose modules are held")
    ap.add_argument("--reboot-seconds", type=float, default=300.0)
    a = ap.parse_args()
    src = {k: "given" for k in ("install", "revert", "selftest", "cluster")}
    install, revert, selftest, cluster = (
        a.install_seconds,
        a.revert_seconds,
        a.selftest_seconds,
        a.cluster_seconds,
    )
    if not a.no_measure:
        with tempfile.TemporaryDirectory(prefix="fleet-upgrade-") as tmp:
            install, revert, selftest = measure_node(a.cache, Path(tmp))
            src.update(install="measured", revert="measured", selftest="measured")
            c = measure_cluster(a.cache, Path(tmp))
            if c is not None:
                cluster, src["cluster"] = c, "measured (real kube-apiserver 1.24)"
    s = Steps(
        install,
        revert,
        selftest,
        cluster,
        a.reload_seconds,
        a.grace_seconds,
        a.verify_interval / 2,
        a.reboot_rate,
        a.reboot_seconds,
        src,
    )
    print(
        f"per node: install {install:.1f} s ({src['install']}), reload {a.reload_seconds:.0f} s (given), "
        f"self-test {selftest:.2f} s ({src['selftest']}) + verdict wait {a.verify_interval / 2:.1f} s "
        "(given), "
        f"cluster steps {cluster:.2f} s ({src['cluster']}), pods' grace {a.grace_seconds:.0f} s (given), "
        f"revert {revert:.2f} s ({src['revert']}), reboots {a.reboot_rate:.0%} x {a.reboot_seconds:.0f} s"
    )
    print(f"{a.nodes} nodes, max unavailable 25 %, failure budget {a.failure_budget}, forks {a.forks}")
    print()
    print(
        f"| batch | failure rate | batches run | upgraded | failed | wall, forks {a.forks} "
        "| wall, forks = batch | outcome |"
    )
    print("|---|---|---|---|---|---|---|---|")
    goals = Goals()
    ok_complete, ok_pause = True, True
    for batch in BATCHES:
        for rate in RATES:
            o = simulate(a.nodes, batch, rate, a.failure_budget, a.forks, s)
            wide = simulate(a.nodes, batch, rate, a.failure_budget, a.nodes, s)
            if o.paused:
                outcome = f"paused after batch {o.batches_run} of {o.batches}"
            else:
                outcome = f"done ({o.batches} batches)"
            print(
                f"| {batch} | {rate:.0%} | {o.batches_run} | {o.upgraded:,} | {o.failed} | {hours(o.wall)} | "
                f"{hours(wide.wall)} | "
                f"{outcome} |"
            )
            if rate == 0.0:
                ok_complete &= o.paused is None and o.upgraded == a.nodes
            else:
                ok_pause &= (o.paused is not None) == (o.expected_pause_batch is not None) and (
                    o.expected_pause_batch is None or o.batches_run == o.expected_pause_batch
                )
    print()
    print(f"rollouts without failures complete  {goals.check('complete', ok_complete)}")
    print(f"the budget pauses at the right batch  {goals.check('budget', ok_pause)}")
    return goals.exit_code()


if __name__ == "__main__":
    run(main)
