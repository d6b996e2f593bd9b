"""`nodeprep list` shows each installed version's module flavour, size and install time (`--json`
adds what doctor works from), and every node command that changes something appends one line per
change to ROOT/var/log/nodeprep.log (nodeprep.node.oplog). Real CLI, a store of small real
artifacts (tests/support/standin.py), a temporary root."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from nodeprep.cli import main
from tests.support.clirunner import separate_stderr
from tests.support.standin import KERNEL, standin_store, tree

V_OLD, V_NEW = "535.216.03", "535.309.01"
LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ (?P<cmd>[a-z -]+)\[\d+\]: (?P<change>.+)$")


def cli(*args: str) -> tuple[int, str, str]:
    r = separate_stderr().invoke(main, list(args))
    return r.exit_code, r.stdout, r.stderr


def changes(root: Path) -> list[tuple[str, str]]:
    text = (root / "var/log/nodeprep.log").read_text()
    found = [LINE.match(line) for line in text.splitlines()]
    assert all(found), text
    return [(m["cmd"], m["change"]) for m in found if m]


def install(root: Path, store: Path, version: str, *extra: str) -> None:
    code, _, err = cli("install", "--store", str(store), "--driver", version, "--kernel", KERNEL,
                       "--root", str(root), "--no-load", *extra)
    assert code == 0, err


def test_list_shows_flavour_size_and_install_time(tmp_path: Path) -> None:
    store = standin_store(tmp_path / "work", tmp_path / "store", V_NEW)
    root = tmp_path / "root"
    root.mkdir()
    install(root, store, V_NEW, "--activate", "--node-store", str(store))
    code, out, _ = cli("list", "--root", str(root))
    assert code == 0
    line = out.splitlines()[0]
    assert re.fullmatch(rf"\* {V_NEW}  \d+\.\d MiB  installed \d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\dZ  "
                        rf"kernels: {KERNEL} \(proprietary\)", line), line
    code, out, _ = cli("list", "--root", str(root), "--json")
    doc = json.loads(out)
    info = doc["installed"][V_NEW]
    size = sum(p.lstat().st_size for p in (root / "opt/nvidia" / V_NEW).rglob("*")
               if p.is_file() and not p.is_symlink())
    assert info["size_bytes"] == size > 0
    assert info["kernels"] == [KERNEL] and info["modules"] == {KERNEL: {"flavour": "proprietary"}}
    assert info["installed_at"].endswith("Z") and info["path"] == f"/opt/nvidia/{V_NEW}"
    assert doc["active"] == V_NEW and doc["previous"] is None
    assert doc["loaded_module"] is None and doc["gpus"] == []  # what doctor's module and gpu checks use
    assert doc["files"]["ld_conf"] == "/etc/ld.so.conf.d/00-nvidia.conf"
    assert doc["kernel_hook"]["store"] == str(store)


def test_node_operations_are_logged_under_the_root(tmp_path: Path) -> None:
    store = standin_store(tmp_path / "work", tmp_path / "store", V_OLD)
    store_new = standin_store(tmp_path / "work2", tmp_path / "store2", V_NEW)
    root = tmp_path / "root"
    root.mkdir()
    install(root, store, V_OLD, "--activate")
    assert changes(root) == [("install", f"installed {V_OLD} for kernel {KERNEL} (proprietary)"),
                             ("install", f"activated {V_OLD} (previous: none)")]
    install(root, store, V_OLD, "--activate")  # nothing changed: nothing logged
    assert len(changes(root)) == 2
    install(root, store_new, V_NEW, "--activate")
    assert cli("rollback", "--root", str(root), "--no-load")[0] == 0
    assert cli("remove", V_NEW, "--root", str(root))[0] == 0
    assert changes(root)[2:] == [
        ("install", f"installed {V_NEW} for kernel {KERNEL} (proprietary)"),
        ("install", f"activated {V_NEW} (previous: {V_OLD})"),
        ("rollback", f"activated {V_OLD} (previous: {V_NEW})"),
        ("remove", f"removed {V_NEW}"),
    ]
    assert (root / "var/log/nodeprep.log").stat().st_mode & 0o777 == 0o640


def test_log_leading_out_of_the_root_is_not_written(tmp_path: Path) -> None:
    """A hostile image whose /var/log links out of the root: the host's file is never touched, the
    operation still succeeds, and one warning line says the log was not written."""
    store = standin_store(tmp_path / "work", tmp_path / "store", V_NEW)
    root, outside = tmp_path / "root", tmp_path / "host-log"
    (root / "var").mkdir(parents=True)
    outside.mkdir()
    (root / "var/log").symlink_to(outside)
    code, _, err = cli("install", "--store", str(store), "--driver", V_NEW, "--kernel", KERNEL,
                       "--root", str(root), "--no-load")
    assert code == 0, err
    assert os.listdir(outside) == []
    assert [ln for ln in err.splitlines() if "operation log" in ln] == [
        f"warning: node operation log {root}/var/log/nodeprep.log not written ({root}/var/log leads "
        f"outside {root})"]


def test_activate_rollback_remove_check_change_nothing(tmp_path: Path) -> None:
    """`--check` is the plan flag of every writing node command: activate, rollback and remove print
    what they would change; the root (driver roots, links, state, log) is left exactly as it was."""
    root = tmp_path / "root"
    root.mkdir()
    install(root, standin_store(tmp_path / "w1", tmp_path / "s1", V_OLD), V_OLD, "--activate")
    install(root, standin_store(tmp_path / "w2", tmp_path / "s2", V_NEW), V_NEW, "--activate")
    before = tree(root)
    assert cli("activate", V_OLD, "--root", str(root), "--kernel", KERNEL, "--check")[1] == (
        f"would activate {V_OLD} (active now: {V_NEW})\n")
    assert cli("activate", V_NEW, "--root", str(root), "--check")[1] == (
        f"{V_NEW} is already active\nnothing to do\n")
    assert cli("rollback", "--root", str(root), "--check")[1] == (
        f"would activate {V_OLD} (active now: {V_NEW})\n")
    code, out, _ = cli("remove", V_OLD, "--root", str(root), "--check", "--json")
    assert code == 0 and json.loads(out) == {"version": V_OLD, "changes": True}
    code, _, err = cli("remove", V_NEW, "--root", str(root), "--check")
    assert code == 2 and err.startswith(f"error: {V_NEW} is the active driver")
    assert tree(root) == before
