"""The first-boot installer (nodeprep/data/install-nodeprep.sh) run as a script on this machine, as on
a node (tests/support/installer.py: /opt and /usr/local/bin are temp directories in a private mount
namespace): it installs the wheel built from this checkout from a store over loopback http, then
again from a directory on the node, replacing the venv. Slow: each run makes a venv (ensurepip)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from nodeprep import __version__, cloudinit
from nodeprep.digests import sha256_file
from tests.support.installer import Node, can_run, python

from .test_cloud_bootstrap import build_wheel, store_server

pytestmark = pytest.mark.slow


def test_installs_the_wheel_from_a_store(tmp_path: Path) -> None:
    if not can_run():
        pytest.skip("needs root, unshare and /opt")
    wheel = build_wheel(tmp_path / "wheel")
    store = tmp_path / "store"
    (store / "tools").mkdir(parents=True)
    shutil.copy(wheel, store / "tools" / wheel.name)
    node = Node(tmp_path / "node")
    with store_server(store) as url:
        run = node.install(python(), "store", f"{url}/tools/{wheel.name}", sha256_file(wheel))
    assert run.returncode == 0, run.stderr
    assert f"nodeprep, version {__version__}" in run.stderr
    link = node.bin / "nodeprep"
    assert os.readlink(link) == "/opt/nodeprep/venv/bin/nodeprep"
    venv = node.opt / "nodeprep" / "venv"
    assert "include-system-site-packages = true" in (venv / "pyvenv.cfg").read_text()
    (site,) = venv.glob("lib/python3*/site-packages")
    assert (site / "nodeprep" / "builder" / "driver.py").is_file()
    assert (site / "nodeprep" / "data" / "install-nodeprep.sh").read_text() == cloudinit.installer()
    assert (site / f"nodeprep-{__version__}.dist-info").is_dir()
    assert node.written() == ["bin/nodeprep", "opt/nodeprep"]  # its temp directory is gone

    # again from a directory on the node: the venv is made anew, the link follows
    (site / "nodeprep" / "stale").write_text("from the first install\n")
    again = node.install(python(), "store", str(store / "tools" / wheel.name), sha256_file(wheel))
    assert again.returncode == 0, again.stderr
    assert not (site / "nodeprep" / "stale").exists() and (site / "nodeprep" / "cli.py").is_file()
    assert os.readlink(link) == "/opt/nodeprep/venv/bin/nodeprep"
