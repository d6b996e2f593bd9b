"""The benches as bench/README.md documents them: each starts with the documented command (`python3
bench/X.py` re-runs itself under .venv), answers --help, exits 2 on a
bad argument, and follows one exit convention (benchlib: 0 goals met, 1 a goal missed, 3 cannot
measure). Only the light labels bench is run for real; the heavy ones are never run by tests."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from types import ModuleType

import pytest

from tests.support.fixtures import REPO

BENCH = REPO / "bench"
BENCHES = sorted(p.stem for p in BENCH.glob("*.py") if p.stem != "benchlib")


def command(name: str) -> list[str]:
    """The command the docs give for a bench (python3: it re-runs itself under .venv)."""
    python3 = shutil.which("python3")
    assert python3, "no python3 on PATH"
    return [python3, f"bench/{name}.py"]


def load(name: str) -> ModuleType:
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def test_every_bench_is_listed_in_the_readme() -> None:
    readme = (BENCH / "README.md").read_text()
    assert BENCHES == ["bootstrap", "build", "companions", "container_start", "daemons", "fleet",
                       "fleet_upgrade", "function_imports", "health", "install", "labels", "profile", "smoke",
                       "store"]
    for name in BENCHES:
        assert f"`bench/{name}.py`" in readme


@pytest.mark.parametrize("name", BENCHES)
def test_help_and_bad_arguments(name: str) -> None:
    ok = subprocess.run([*command(name), "--help"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("usage: ") and "Traceback" not in ok.stderr
    bad = subprocess.run([*command(name), "--no-such-option"], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "error: unrecognized arguments: --no-such-option" in bad.stderr


def test_labels_bench_exit_code_matches_its_verdicts() -> None:
    run = subprocess.run([*command("labels"), "--runs", "3"], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    verdicts = re.findall(r"  (OK|MISSED)$", run.stdout, re.M)
    assert len(verdicts) == 5, run.stdout + run.stderr
    assert run.returncode == (1 if "MISSED" in verdicts else 0)
    last = run.stdout.splitlines()[-1]
    assert last == ("goals: all 5 met" if run.returncode == 0 else last) and last.startswith("goals: ")


def test_benchlib_convention(capsys: pytest.CaptureFixture[str]) -> None:
    benchlib = load("benchlib")
    goals = benchlib.Goals()
    assert goals.at_most("fast", 0.5, 1.0) == "OK" and goals.at_least("ratio", 30, 25) == "OK"
    assert goals.exit_code() == 0
    assert goals.at_most("hit <= 2 s", 2.5, 2.0) == "MISSED" and goals.exit_code() == 1
    assert capsys.readouterr().out.splitlines() == ["goals: all 2 met", "goals: 1 of 3 missed (hit <= 2 s)"]

    def crash() -> int:
        raise RuntimeError("the build failed")

    for main, code in ((lambda: 0, 0), (lambda: 1, 1), (crash, 3), (lambda: (_ for _ in ()).throw(
            SystemExit("site.yml failed")), 3)):
        with pytest.raises(SystemExit) as e:
            benchlib.run(main)
        assert e.value.code == code
    with pytest.raises(SystemExit) as e:
        benchlib.cannot_measure("needs root")
    assert e.value.code == 3 and "cannot measure here: needs root" in capsys.readouterr().err


def test_smoke_bench_picks_the_newest_kernel_by_abi_number() -> None:
    """`bench/smoke.py` without --kernel: the newest linux-image-6.1.0-<ABI>-amd64 (ABI as a number)."""
    smoke = load("smoke")
    names = ["linux-image-6.1.0-9-amd64", "linux-image-6.1.0-41-amd64", "linux-image-6.1.0-100-amd64",
             "linux-image-6.1.0-41-amd64-dbg", "linux-image-6.1.0-28-amd64"]
    assert smoke.newest_kernel(names) == "6.1.0-100-amd64"
    with pytest.raises(SystemExit, match="no linux-image-6.1.0"):
        smoke.newest_kernel(["linux-image-amd64"])


def test_store_bench_counts_the_cpu_of_a_server_and_its_workers() -> None:
    """bench/store.py's cpu_of: a server's CPU includes its still running descendants (nginx's
    workers); a process that is gone counts 0."""
    store = load("store")
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ntime.sleep(30)"
    proc = subprocess.Popen(["sh", "-c", f"{sys.executable} -c '{burn}' & wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while store.cpu_of(proc.pid) < 0.25 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert store.cpu_of(proc.pid) >= 0.25
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the shell and its python child: the group we started
        proc.wait()
    assert store.cpu_of(proc.pid) == 0.0


def test_container_start_compares_with_the_spec_nvidia_writes_on_a_gpu_node(tmp_path) -> None:
    """The `nvidia` row runs the hooks of NVIDIA's spec as the H200 had it (v1.20.0, NVML mode), in
    that order, each with NVIDIA's environment: a graphics-only create-symlinks (GBM) aside, no hook
    of theirs is left out of the comparison."""
    import yaml

    from tests.support.fixtures import REPO as repo

    fixture = repo / "tests/fixtures/gpu-machine/h200_580.159.04.nvidia-ctk.yaml"
    captured = yaml.safe_load(fixture.read_text())
    theirs = [h for h in captured["containerEdits"]["hooks"] if "gbm" not in " ".join(h["args"])]
    bench = load("container_start")
    hooks, _ = bench.nvidia_form(tmp_path, "/usr/bin/nvidia-cdi-hook")
    assert [h["args"][:2] for h in hooks] == [h["args"][:2] for h in theirs]
    assert [h["env"] for h in hooks] == [h["env"] for h in theirs]
    assert hooks[1]["args"] == [a.replace("580.159.04", bench.VERSION) for a in theirs[1]["args"]]


def test_fleet_upgrade_simulation_pauses_at_the_failure_budget() -> None:
    """bench/fleet_upgrade.py's simulate over the library's planner: no failures complete the rollout;
    with failures it pauses after the first batch whose failures reach the budget, having upgraded only
    the nodes that did not fail in the batches run."""
    bench = load("fleet_upgrade")
    steps = bench.Steps(install=8, revert=1, selftest=0.5, cluster=2, reload=20, grace=30, verify_wait=7.5,
                        reboot_rate=0.0, reboot=300, source={})
    done = bench.simulate(200, "10%", 0.0, 3, 25, steps)
    assert done.paused is None and done.upgraded == 200 and done.batches_run == done.batches == 10
    paused = bench.simulate(200, "10%", 0.2, 3, 25, steps)
    assert paused.paused and paused.batches_run == paused.expected_pause_batch == 1
    assert paused.upgraded + paused.failed == 20 and paused.failed >= 3
    assert paused.wall < done.wall
