"""`nodeprep uninstall --root IMG` and what the image holds (issue #35, finding 6): dpkg's file
lists are read beneath the root and only as regular files (a FIFO is one error line, never a hang;
an `info` link to a host folder reads the image's folder of that name, not the host's); a journal
planted in the image removes nothing nodeprep did not make; an uninstall of an image without
nodeprep writes nothing at all (no lock, no ld cache). Real CLI processes (a hang must time out),
real artifacts (tests/support/standin.py), real ldconfig and depmod.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from nodeprep import runner
from nodeprep.cli import main
from tests.support.standin import KERNEL, standin_store
from tests.unit.join.conftest import build_payload
from tests.unit.node.test_node_uninstall import debian_root

REPO = Path(__file__).resolve().parents[3]
VERSION = "535.309.01"
UPDATES = f"/lib/modules/{KERNEL}/updates"  # a folder install makes and uninstall removes once empty


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("image-input")
    return standin_store(work, work / "store", VERSION)


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A real `nodeprep` process; a hang fails the test after `timeout` seconds."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "nodeprep.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, check=False)


def installed(store: Path, root: Path) -> Path:
    debian_root(root)
    r = CliRunner().invoke(main, ["install", "--store", str(store), "--driver", VERSION, "--kernel", KERNEL,
                                  "--activate", "--root", str(root)])
    assert r.exit_code == 0, r.output
    assert (root / UPDATES.lstrip("/")).is_dir()
    return root


def tree(root: Path) -> dict[str, tuple[object, ...]]:
    """Every path under `root`, links not followed: kind, mode, inode and mtime (a file rewritten
    with the same bytes differs), link text."""
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            st = p.lstat()
            text = os.readlink(p) if stat.S_ISLNK(st.st_mode) else None
            out[p.relative_to(root).as_posix()] = (st.st_mode, st.st_ino, st.st_mtime_ns, text)
    return out


def test_a_fifo_among_dpkg_lists_is_one_error_line_not_a_hang(store: Path, tmp_path: Path) -> None:
    root = installed(store, tmp_path / "root")
    info = root / "var/lib/dpkg/info"
    info.mkdir(parents=True)
    (info / "base-files.list").write_text("/etc\n/usr\n")
    os.mkfifo(info / "evil.list")
    before = tree(root)
    for args in (["--check"], ["--check", "--json"], []):
        r = cli("uninstall", "--root", str(root), *args, timeout=30)
        assert r.returncode == 2, r
        errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and str(info / "evil.list") in errors[0] and "FIFO" in errors[0], r.stderr
        assert "Traceback" not in r.stderr + r.stdout
        assert tree(root) == before  # the root as it was


def test_dpkg_lists_are_the_images_not_the_hosts(store: Path, tmp_path: Path) -> None:
    """ROOT/var/lib/dpkg/info as an absolute link to a host folder whose list names the folder
    uninstall removes: the host's list does not decide; the image's own folder of that name does."""
    host = tmp_path / "host-info"
    host.mkdir()
    (host / "hostpkg.list").write_text(f"{UPDATES}\n")
    root = installed(store, tmp_path / "root")
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/info").symlink_to(host)
    plan = json.loads(cli("uninstall", "--root", str(root), "--check", "--json").stdout)
    assert UPDATES in plan["remove"]
    inside = root / str(host).lstrip("/")  # where the link leads inside the image
    inside.mkdir(parents=True)
    (inside / "imagepkg.list").write_text(f"{UPDATES}\n")
    plan = json.loads(cli("uninstall", "--root", str(root), "--check", "--json").stdout)
    assert UPDATES not in plan["remove"]
    r = cli("uninstall", "--root", str(root))
    assert r.returncode == 0, r
    assert (root / UPDATES.lstrip("/")).is_dir() and (host / "hostpkg.list").is_file()


@pytest.mark.parametrize("with_nodeprep", [False, True])
def test_a_planted_journal_removes_nothing_nodeprep_did_not_make(store: Path, tmp_path: Path,
                                                                  with_nodeprep: bool) -> None:
    root = installed(store, tmp_path / "root") if with_nodeprep else debian_root(tmp_path / "root")
    (root / "srv/x").mkdir(parents=True)
    (root / "var/lib/nodeprep").mkdir(parents=True, exist_ok=True)
    (root / "var/lib/nodeprep/uninstall.json").write_text(json.dumps({"folders": ["/srv/x", "/srv"]}))
    check = cli("uninstall", "--root", str(root), "--check", "--json")
    assert check.returncode == 0, check
    plan = json.loads(check.stdout)
    assert not {"/srv/x", "/srv"} & set(plan["remove"])
    assert any(line.startswith("/srv/x: named in /var/lib/nodeprep/uninstall.json") for line in plan["kept"])
    r = cli("uninstall", "--root", str(root))
    assert r.returncode == 0, r
    assert (root / "srv/x").is_dir()
    assert ("warning: /srv/x: named in /var/lib/nodeprep/uninstall.json but not a path nodeprep makes"
            in r.stderr)
    assert not (root / "var/lib/nodeprep").exists()  # the planted journal was in nodeprep's folder


def test_a_malformed_journal_is_one_error_line(tmp_path: Path) -> None:
    root = debian_root(tmp_path / "root")
    (root / "var/lib/nodeprep").mkdir(parents=True)
    (root / "var/lib/nodeprep/uninstall.json").write_text(json.dumps({"folders": ["srv/relative"]}))
    before = tree(root)
    r = cli("uninstall", "--root", str(root))
    assert r.returncode == 2, r
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "uninstall.json: folders[0]" in errors[0], r.stderr
    assert tree(root) == before


def test_a_no_op_uninstall_writes_nothing(tmp_path: Path) -> None:
    """An image without nodeprep whose ld cache lists a libcuda.so.1 the distribution installed at
    an entry point's path: nothing is written (no ldconfig, no lock, no log), not even rewritten."""
    root = debian_root(tmp_path / "root")
    payload = build_payload(tmp_path / "payload", VERSION)
    libdir = root / "usr/lib/x86_64-linux-gnu"
    shutil.copy(payload / "lib64" / f"libcuda.so.{VERSION}", libdir)
    (libdir / "libcuda.so.1").symlink_to(f"libcuda.so.{VERSION}")
    runner.run(["ldconfig", "-r", root], timeout=60)
    entries = runner.run(["ldconfig", "-p", "-C", root / "etc/ld.so.cache"], timeout=60).stdout
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.1" in entries
    before = tree(root)
    for args in (["--check"], [], ["--json"]):
        r = cli("uninstall", "--root", str(root), *args)
        assert r.returncode == 0, r
        assert tree(root) == before, args
    assert "nothing to do" in cli("uninstall", "--root", str(root), "--check").stdout
