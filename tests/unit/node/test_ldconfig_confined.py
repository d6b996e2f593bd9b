"""The host's `ldconfig -r ROOT` for an image under `--root` (install, activate, rollback, uninstall):
it chroots itself, but a procfs mounted in the image (a chroot set up for a build) leads out through
/proc/<pid>/root. Real ldconfig, real mounts in a private mount namespace (root and util-linux
unshare); a process of this test stands for any process whose root is the host's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nodeprep.node.integration import proc_mounts_beneath

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="mount namespaces need root and util-linux unshare")
RUN = ("from pathlib import Path; from nodeprep.node import integration; "
       "from nodeprep.node.layout import Layout; from nodeprep.errors import InputError\n"
       "try:\n    integration.run_ldconfig(Layout(Path({root!r})))\n"
       "except InputError as e:\n    print('error:', e.message)")


def image_naming_the_host(tmp_path: Path, pid: int) -> tuple[Path, Path]:
    """An image whose ld.so.conf names /proc/<pid>/root/<a host folder with a library lacking its
    soname link>, and that host folder."""
    host = tmp_path / "host-lib"
    host.mkdir()
    (tmp_path / "foo.c").write_text("int foo(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libfoo.so.1", "-o", host / "libfoo.so.1.0",
                    tmp_path / "foo.c"], check=True, timeout=120)
    root = tmp_path / "img"
    for d in ("etc", "proc", "mnt/proc"):
        (root / d).mkdir(parents=True)
    (root / "etc/ld.so.conf").write_text(f"/proc/{pid}/root{host}\n")
    return root, host


def run_with_proc_at(root: Path, where: str) -> subprocess.CompletedProcess[str]:
    script = f'mount -t proc proc "{root}/{where}" && exec "$0" -c "$1"'
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                           sys.executable, RUN.format(root=str(root))], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("where", ["proc", "mnt/proc"])
def test_a_procfs_in_the_image_does_not_lead_ldconfig_out(tmp_path: Path, where: str) -> None:
    host_init = subprocess.Popen(["sleep", "120"])
    try:
        root, host = image_naming_the_host(tmp_path, host_init.pid)
        r = run_with_proc_at(root, where)
    finally:
        host_init.kill()
        host_init.wait()
    assert sorted(p.name for p in host.iterdir()) == ["libfoo.so.1.0"], r  # no libfoo.so.1 made there
    if where == "proc":  # the usual chroot setup: the cache is rebuilt, of the image alone
        assert r.returncode == 0 and r.stdout == "", r
        assert b"libfoo" not in (root / "etc/ld.so.cache").read_bytes()
    else:  # a procfs elsewhere in the image: refused, nothing changed
        assert r.stdout.startswith(f"error: {root}/mnt/proc: a procfs mounted inside --root"), r
        assert not (root / "etc/ld.so.cache").exists()


def test_proc_mounts_beneath_reads_mountinfo() -> None:
    info = ("22 1 0:21 / /proc rw - proc proc rw\n"
            "90 80 0:55 / /srv/img/proc rw,nosuid - proc proc rw\n"
            "91 80 0:56 / /srv/img\\040x/proc rw - proc proc rw\n"
            "92 80 0:57 / /srv/img/sys rw - sysfs sysfs rw\n"
            "93 80 0:58 / /srv/image/proc rw - proc proc rw\n")
    assert proc_mounts_beneath(Path("/srv/img"), info) == ["/srv/img/proc"]
    assert proc_mounts_beneath(Path("/srv/img x"), info) == ["/srv/img x/proc"]
