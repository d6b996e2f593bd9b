"""The first-boot installer (nodeprep/data/install-nodeprep.sh) as a script: dash parses it, and run
as on a node (tests/support/installer.py) it refuses bad arguments and a wheel with another sha256
before touching anything. (tests/slow/bootstrap/test_installer_script.py installs the real wheel.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeprep import cloudinit, runner
from nodeprep.digests import sha256_bytes
from tests.support.installer import Node, can_run, python


def test_installer_is_valid_posix_sh() -> None:
    """The installer runs under /bin/sh on the node: dash must parse it."""
    sh = runner.which("dash") or "sh"
    assert runner.run([sh, "-n", cloudinit.INSTALLER_SCRIPT]).returncode == 0


def test_refuses_before_touching_anything(tmp_path: Path) -> None:
    if not can_run():
        pytest.skip("needs root, unshare and /opt")
    node = Node(tmp_path)
    usage = node.install(python(), "bogus", "x")
    assert usage.returncode == 2 and usage.stderr.startswith("usage: install-nodeprep")
    assert node.install(python(), "store", "only-a-url").returncode == 2
    served = tmp_path / cloudinit.wheel_name()
    served.write_bytes(b"PK\x05\x06" + b"\0" * 18 + b"tampered")
    pinned = sha256_bytes(b"PK\x05\x06" + b"\0" * 18)
    bad = node.install(python(), "store", f"file://{served}", pinned)
    assert bad.returncode == 1 and f"install-nodeprep: sha256 mismatch for file://{served}" in bad.stderr
    assert node.written() == []  # nothing in /opt or /usr/local/bin, its temp directory gone
