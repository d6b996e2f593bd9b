"""`nodeprep bootstrap` as a command: exit codes, journal lines, --json, resume, against a temporary
root. The full bring-up with real artifacts is in tests/slow/bootstrap/."""

from __future__ import annotations

import json
from pathlib import Path

from nodeprep.cli import main
from tests.support.clirunner import separate_stderr


def invoke(*args: str) -> tuple[int, str, str]:
    r = separate_stderr().invoke(main, ["bootstrap", *args])
    return r.exit_code, r.stdout, r.stderr


def profile(tmp_path: Path, store: Path) -> Path:
    p = tmp_path / "node.yaml"
    p.write_text(f'driver:\n  version: "535.309.01"\n  store: {store}\n  kernel: 6.1.0-28-amd64\n'
                 "labels:\n  cloud: none\n")
    return p


def test_bad_profile_exit_2_and_nothing_written(tmp_path: Path) -> None:
    bad = tmp_path / "node.yaml"
    bad.write_text('driver:\n  version: "535.309.01"\n  flavour: closed\n')
    root = tmp_path / "root"
    root.mkdir()
    code, out, err = invoke("--root", str(root), "--profile", str(bad))
    assert code == 2 and out == ""
    assert err.startswith("error: ") and "driver.flavour" in err and "Traceback" not in err
    assert list(root.iterdir()) == []


def test_missing_default_profile(tmp_path: Path) -> None:
    code, _, err = invoke("--root", str(tmp_path))
    assert code == 2
    assert err.strip() == f"error: {tmp_path}/etc/nodeprep/node.yaml: no profile (pass --profile FILE)"


def test_bad_store_fails_the_first_step_and_resumes(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    store = tmp_path / "store"  # not there yet (e.g. not mounted)
    p = profile(tmp_path, store)
    code, out, err = invoke("--root", str(root), "--profile", str(p), "--json")
    assert code == 2, err
    data = json.loads(out)
    assert data["ok"] is False and data["exit_code"] == 2
    assert [(s["name"], s["status"]) for s in data["steps"]] == [
        ("driver", "failed"), ("modules", "pending"), ("labels", "pending"), ("runtime", "pending"),
        ("join", "pending")]
    assert data["steps"][0]["error"] == f"--store: {store} is not a directory"
    state = json.loads((root / "var/lib/nodeprep/bootstrap.json").read_text())
    assert state["runs"][data["profile_digest"]]["steps"]["driver"]["status"] == "failed"

    # journal mode: one line per step, then the summary
    code, out, err = invoke("--root", str(root), "--profile", str(p))
    assert code == 2 and out == ""
    lines = [ln for ln in err.splitlines() if ln.startswith("bootstrap: ")]
    assert lines[0].startswith("bootstrap: driver: failed in ") and lines[0].endswith(
        f": --store: {store} is not a directory")
    assert lines[1:5] == [f"bootstrap: {n}: not run (an earlier step failed)"
                          for n in ("modules", "labels", "runtime", "join")]
    assert lines[5].startswith("bootstrap: FAILED (rerun to resume) in ")
    assert "1 failed, 4 pending" in lines[5]


def test_help_lists_the_steps() -> None:
    code, out, _ = invoke("--help")
    assert code == 0
    for word in ("driver", "labels", "join", "--root", "--json", "--dry-run-join", "--restart"):
        assert word in out
