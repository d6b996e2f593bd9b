"""`nodeprep upgrade` without a cluster: `plan` over an inventory, `budget`, the node-side `reload`
decision over a tree under --root, and `revert` of a real install from a store of small real artifacts
(tests/support/standin.py) in a temporary root. Nothing GPU-like: no module is loaded here."""

from __future__ import annotations

import json
import os
from pathlib import Path

from nodeprep.cli import main
from tests.support.clirunner import separate_stderr
from tests.support.standin import KERNEL, standin_store

V_OLD, V_NEW = "535.216.03", "535.309.01"


def cli(*args: str) -> tuple[int, str, str]:
    r = separate_stderr().invoke(main, list(args))
    return r.exit_code, r.stdout, r.stderr


def test_plan_without_a_cluster_prints_batches_in_inventory_order() -> None:
    code, out, _ = cli(
        "upgrade",
        "plan",
        "--node",
        "n1,n2,n3",
        "--node",
        "n4,n5",
        "--version",
        V_NEW,
        "--batch",
        "40%",
        "--max-unavailable",
        "100%",
    )
    assert code == 0
    assert out.splitlines() == [
        f"rollout to {V_NEW}: 5 node(s) in 3 batch(es) of at most 2; max unavailable 5; failure budget 1",
        "batch 1: n1, n2",
        "batch 2: n3, n4",
        "batch 3: n5",
    ]
    code, out, _ = cli(
        "upgrade", "plan", "--node", "n1,n2,n3,n4", "--version", V_NEW, "--batch", "3", "--json"
    )
    assert json.loads(out)["serial"] == [1, 1, 1, 1]  # the default max unavailable, 25 %: one at a time


def test_plan_refuses_bad_sizes_with_one_line() -> None:
    code, _, err = cli("upgrade", "plan", "--node", "n1", "--version", V_NEW, "--batch", "0%")
    assert code == 2 and err.strip() == "error: --batch: '0%': a percentage is 1% to 100%"
    code, _, err = cli("upgrade", "plan", "--node", "n1,n1", "--version", V_NEW)
    assert code == 2 and "named twice" in err


def test_budget_pauses_naming_the_failed_nodes() -> None:
    code, out, _ = cli("upgrade", "budget", "--failed", "n2", "--version", V_NEW, "--failure-budget", "2")
    assert code == 0 and out.strip() == "1 failed node(s), failure budget 2"
    code, _, err = cli("upgrade", "budget", "--failed", "n2,n7", "--version", V_NEW, "--failure-budget", "2")
    assert code == 1
    assert err.strip() == "error: rollout paused: 2 failed node(s) reach the failure budget 2: n2, n7"


def test_reload_decision_reads_refcounts_under_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    nv = root / "sys/module/nvidia"
    (nv / "holders/nvidia_uvm").mkdir(parents=True)
    (nv / "version").write_text(V_OLD + "\n")
    (nv / "refcnt").write_text("1\n")
    (root / "proc/9/fd").mkdir(parents=True)
    os.symlink("/dev/nvidiactl", root / "proc/9/fd/3")
    (root / "proc/9/comm").write_text("nvidia-persiste\n")
    code, out, _ = cli("upgrade", "reload", "--root", str(root), "--version", V_NEW, "--check", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["action"] == "reboot" and doc["reboot_required"]
    assert doc["reasons"][-1] == "process 9 (nvidia-persiste) has /dev/nvidiactl open"
    os.unlink(root / "proc/9/fd/3")
    code, out, _ = cli("upgrade", "reload", "--root", str(root), "--version", V_NEW, "--json")
    doc = json.loads(out)
    assert doc["action"] == "reload" and doc["done"] == [] and not doc["changed"]
    code, out, _ = cli("upgrade", "reload", "--root", str(root), "--version", V_NEW)
    assert (
        out.splitlines()[-1]
        == f"--root {root}: modules are not loaded for an image (the unit loads them at boot)"
    )


def test_revert_rolls_back_only_the_target(tmp_path: Path) -> None:
    stores = {v: standin_store(tmp_path / "work" / v, tmp_path / "store" / v, v) for v in (V_OLD, V_NEW)}
    root = tmp_path / "root"
    root.mkdir()
    for v in (V_OLD, V_NEW):
        code, _, err = cli(
            "install",
            "--store",
            str(stores[v]),
            "--driver",
            v,
            "--kernel",
            KERNEL,
            "--root",
            str(root),
            "--no-load",
            "--activate",
            "--node-store",
            str(stores[v]),
        )
        assert code == 0, err
    state = lambda: json.loads((root / "var/lib/nodeprep/state.json").read_text())  # noqa: E731
    assert state()["active"] == V_NEW
    code, out, _ = cli("upgrade", "revert", "--root", str(root), "--version", V_NEW, "--check")
    assert code == 0 and out.strip() == f"would roll {V_NEW} back to {V_OLD}" and state()["active"] == V_NEW
    code, out, err = cli("upgrade", "revert", "--root", str(root), "--version", V_NEW, "--no-load")
    assert code == 0, err
    assert out.strip() == f"rolled {V_NEW} back: active {V_OLD}"
    assert state()["active"] == V_OLD and os.readlink(root / "opt/nvidia/current") == V_OLD
    code, out, _ = cli("upgrade", "revert", "--root", str(root), "--version", V_NEW)
    assert code == 0 and out.strip() == f"unchanged: {V_NEW} is not active (active: {V_OLD})"
