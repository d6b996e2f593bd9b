"""Run the first-boot installer (nodeprep/data/install-nodeprep.sh) as on a node, without touching
this machine: a private mount namespace with temp directories bind-mounted over /opt and
/usr/local/bin (needs root and unshare)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from nodeprep import cloudinit

IN_NAMESPACE = 'mount --bind "$OPT" /opt && mount --bind "$BIN" /usr/local/bin && exec "$@"'


def can_run() -> bool:
    return os.geteuid() == 0 and shutil.which("unshare") is not None and Path("/opt").is_dir()


def python() -> str:
    """The interpreter behind this virtualenv (the installer makes its own venv from it)."""
    return getattr(sys, "_base_executable", sys.executable)


class Node:
    """/opt, /usr/local/bin and TMPDIR of a node, as temp directories under `tmp`."""

    def __init__(self, tmp: Path) -> None:
        self.opt, self.bin, self.tmp = tmp / "opt", tmp / "bin", tmp / "tmp"
        for d in (self.opt, self.bin, self.tmp):
            d.mkdir(parents=True)

    def install(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run the installer with `args`. The venv it makes sees this checkout's virtualenv through
        PYTHONPATH (a node has the distribution's python3-* packages instead)."""
        env = {**os.environ, "OPT": str(self.opt), "BIN": str(self.bin), "TMPDIR": str(self.tmp),
               "PYTHONPATH": sysconfig.get_paths()["purelib"], "no_proxy": "127.0.0.1"}
        return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", IN_NAMESPACE, "sh",
                               "sh", str(cloudinit.INSTALLER_SCRIPT), *args],
                              env=env, capture_output=True, text=True, timeout=300)

    def written(self) -> list[str]:
        return sorted(str(p.relative_to(self.opt.parent)) for d in (self.opt, self.bin, self.tmp)
                      for p in d.iterdir())
