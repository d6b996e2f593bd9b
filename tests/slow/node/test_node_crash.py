"""kill -9 of a real `python -m nodeprep.cli` process at named points of install, activate, rollback
and remove (NODEPREP_CRASH_AT, see nodeprep/crash.py). After each kill the active version still
resolves through the real ld cache of the Debian rootfs, `doctor` passes its library checks, and the
same command run again completes and leaves no temporaries behind."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from nodeprep.node.doctor import doctor
from nodeprep.node.state import load_state

from .helpers import V_NEW, V_OLD, NodeStore, cli, install_cli, ldcache, resolve

pytestmark = pytest.mark.slow

UPGRADE_POINTS = [
    "install:locked",
    "install:fetched",
    "install:userspace-extracted",
    "install:kmod-extracted",
    "install:kmod-staged",
    "install:ldconfig-n",
    "install:renamed",
    "install:unpacked",
    "install:firmware-linked",
    "install:state-tmp",
    "install:state-written",
    "activate:start",
    "activate:ld-conf",
    "activate:modprobe-conf",
    "activate:unit",
    "activate:module-links",
    "activate:state-tmp",
    "activate:state-written",
    "activate:link-created",
    "activate:flipped",
    "activate:ldconfig",
    "activate:depmod",
]
SWITCHED_FROM = UPGRADE_POINTS.index("activate:flipped")
FIRST_ACTIVATION_POINTS = [
    "activate:ld-conf-tmp",
    "activate:modprobe-conf-tmp",
    "activate:unit-tmp",
    "activate:link-created",
]
ROLLBACK_POINTS = ["activate:state-written", "activate:link-created", "activate:flipped", "activate:ldconfig"]


@pytest.fixture(scope="module")
def bases(
    node_store: NodeStore, rootfs_tar: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """Roots prepared once: `installed` (V_OLD installed, nothing active), `active` (V_OLD active)
    and `both` (V_OLD active with V_NEW installed: rollback has somewhere to go after a switch)."""
    import tarfile

    base = tmp_path_factory.mktemp("bases")
    installed = base / "installed"
    installed.mkdir()
    with tarfile.open(rootfs_tar) as t:
        t.extractall(installed, filter="fully_trusted")
    args = ("--store", str(node_store.path), "--kernel", node_store.kernel)
    assert cli("install", "--driver", V_OLD, *args, "--root", str(installed)).returncode == 0
    active = base / "active"
    subprocess.run(["cp", "-a", str(installed), str(active)], check=True)
    assert cli("activate", V_OLD, "--root", str(active)).returncode == 0
    both = base / "both"
    subprocess.run(["cp", "-a", str(active), str(both)], check=True)
    assert cli("install", "--driver", V_NEW, *args, "--root", str(both), "--activate").returncode == 0
    return {"installed": installed, "active": active, "both": both}


def clone(src: Path, dest: Path) -> Path:
    """Hard-link copy (nodeprep replaces files by rename, never in place); the lock file, written
    in place, gets its own inode."""
    subprocess.run(["cp", "-al", str(src), str(dest)], check=True)
    lock = dest / "var/lib/nodeprep/lock"
    if lock.exists():
        lock.unlink()
    return dest


def resolved_version(root: Path) -> str:
    real = resolve(root, ldcache(root)["libnvidia-ml.so.1"])
    assert real.startswith("/opt/nvidia/"), real
    return real.split("/")[3]


def leftovers(root: Path) -> list[str]:
    found = []
    for d in (
        root / "opt/nvidia",
        root / "etc/ld.so.conf.d",
        root / "etc/modprobe.d",
        root / "etc/systemd/system",
        root / "var/lib/nodeprep",
    ):
        if d.is_dir():
            found += [
                str(p)
                for p in d.iterdir()
                if p.name.startswith((".staging-", ".tmp-", ".current-", ".removing-"))
            ]
    for v in (root / "opt/nvidia").iterdir():
        if (v / "modules").is_dir():
            found += [str(p) for p in (v / "modules").iterdir() if p.name.startswith(".")]
    return found


def assert_usable(root: Path, version: str) -> None:
    assert load_state(root).active == version
    assert resolved_version(root) == version
    report = doctor(root, checks={"state", "ldcache"})
    assert report.ok, report.render()
    assert f"/opt/nvidia/{version}/lib64/libcuda.so.{version}" in report.checks[1].message


@pytest.mark.parametrize("point", UPGRADE_POINTS)
def test_kill_during_install_and_activate(
    point: str, bases: dict[str, Path], node_store: NodeStore, tmp_path: Path
) -> None:
    root = clone(bases["active"], tmp_path / "root")
    argv = (node_store.path, V_NEW, node_store.kernel, root, "--activate")
    r = install_cli(*argv, env={"NODEPREP_CRASH_AT": point})
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr)
    expected = V_NEW if UPGRADE_POINTS.index(point) >= SWITCHED_FROM else V_OLD
    assert_usable(root, expected)

    r = install_cli(*argv, "--json")
    assert r.returncode == 0, r.stderr
    assert_usable(root, V_NEW)
    state = load_state(root)
    assert state.previous == V_OLD and sorted(state.installed) == sorted([V_NEW, V_OLD])
    assert leftovers(root) == []
    assert json.loads((root / "var/lib/nodeprep/state.json").read_text())["active"] == V_NEW


@pytest.mark.parametrize("point", FIRST_ACTIVATION_POINTS)
def test_kill_during_first_activation(point: str, bases: dict[str, Path], tmp_path: Path) -> None:
    """Nothing was active before: after the kill no half-written configuration is visible (each file is
    either absent or complete), and the rerun activates."""
    root = clone(bases["installed"], tmp_path / "root")
    r = cli("activate", V_OLD, "--root", str(root), env={"NODEPREP_CRASH_AT": point})
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr)
    conf = root / "etc/ld.so.conf.d/00-nvidia.conf"
    assert not conf.exists() or conf.read_text() == "/opt/nvidia/current/lib64\n"
    assert load_state(root).active is None
    r = cli("activate", V_OLD, "--root", str(root))
    assert r.returncode == 0, r.stderr
    assert_usable(root, V_OLD)
    assert leftovers(root) == []


@pytest.mark.parametrize("point", ROLLBACK_POINTS)
def test_kill_during_rollback(point: str, bases: dict[str, Path], tmp_path: Path) -> None:
    root = clone(bases["both"], tmp_path / "root")
    assert_usable(root, V_NEW)
    r = cli("rollback", "--root", str(root), env={"NODEPREP_CRASH_AT": point})
    assert r.returncode == -signal.SIGKILL
    assert_usable(root, V_OLD if ROLLBACK_POINTS.index(point) >= 2 else V_NEW)
    r = cli("activate", V_OLD, "--root", str(root))
    assert r.returncode == 0, r.stderr
    assert_usable(root, V_OLD)
    assert load_state(root).previous == V_NEW
    assert leftovers(root) == []


def test_kill_during_remove(bases: dict[str, Path], tmp_path: Path) -> None:
    root = clone(bases["both"], tmp_path / "root")
    r = cli("remove", V_OLD, "--root", str(root), env={"NODEPREP_CRASH_AT": "remove:renamed"})
    assert r.returncode == -signal.SIGKILL
    assert_usable(root, V_NEW)
    assert V_OLD not in load_state(root).installed  # renamed away: no longer a complete version
    assert leftovers(root)  # the .removing-* directory
    r = cli("list", "--root", str(root))
    assert r.returncode == 0 and V_OLD not in r.stdout
    r = cli("remove", V_OLD, "--root", str(root))
    assert r.returncode == 0
    assert leftovers(root) == []
    shutil.rmtree(root)
