"""install + uninstall on a real Debian 12 image leaves nothing behind but the operation log
(issue #35, finding 6). The image is mmdebstrap's minbase, as image builds start: no kernel package,
no /usr/lib/firmware, no systemd, no /etc/modprobe.d; the install (`--activate`, the kernel hooks)
makes those folders, runs depmod for a kernel the image does not have and ldconfig (which makes
/var/cache/ldconfig/aux-cache), and uninstall takes all of it away again. The artifacts are the small
real ones of tests/support/standin.py: what matters here is the paths install creates, not the
module. Also: an uninstall of the image before any install changes nothing, not even a file's
inode or time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.standin import KERNEL, standin_store
from tests.support.tree import snapshot as tree_snapshot

from .helpers import cli, install_cli

pytestmark = pytest.mark.slow

VERSION = "535.309.01"
OPLOG = "var/log/nodeprep.log"


def snapshot(root: Path, *, times: bool = False) -> dict[str, tuple[object, ...]]:
    return tree_snapshot(root, skip=(OPLOG,), times=times)


def test_install_uninstall_on_debian12_minbase_leaves_only_the_log(rootfs: Path, tmp_path: Path) -> None:
    store = standin_store(tmp_path / "work", tmp_path / "store", VERSION)
    assert not (rootfs / f"usr/lib/modules/{KERNEL}").exists()  # no kernel package in the image
    before = snapshot(rootfs)
    r = install_cli(store, VERSION, KERNEL, rootfs, "--activate")
    assert r.returncode == 0, r.stderr
    installed = snapshot(rootfs)
    for made in (f"usr/lib/modules/{KERNEL}/modules.dep", "var/cache/ldconfig/aux-cache", "usr/lib/firmware"):
        assert made in installed and made not in before, made

    check = cli("uninstall", "--root", str(rootfs), "--check", "--json")
    assert check.returncode == 0, check.stderr
    assert snapshot(rootfs) == installed
    r = cli("uninstall", "--root", str(rootfs))
    assert r.returncode == 0, r.stderr
    after = snapshot(rootfs)
    assert sorted(set(after) - set(before)) == [] and sorted(set(before) - set(after)) == []
    assert {k for k in before if before[k] != after[k]} == set()
    assert "uninstall" in (rootfs / OPLOG).read_text()


def test_uninstall_of_an_image_without_nodeprep_writes_nothing(rootfs: Path) -> None:
    before = snapshot(rootfs, times=True)
    for args in (["--check"], []):
        r = cli("uninstall", "--root", str(rootfs), *args)
        assert r.returncode == 0, r.stderr
        assert snapshot(rootfs, times=True) == before, args
