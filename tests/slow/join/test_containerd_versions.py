"""containerd 1.7 (Debian 13) and 2.1 (Debian sid) start with nodeprep's drop-in merged and report
the `nvidia` runtime and CDI settings it carries.

The binaries come from Debian's .debs, fetched through nodeprep's own archive access
(nodeprep.sources.debian, sha256-checked) and unpacked with dpkg-deb into the test cache. Each
daemon runs from `containerd config default` of its own version (root, state and socket moved into
the temp dir) in a private mount namespace: the test root's /etc/containerd is bind-mounted over
/etc/containerd (so the main config's absolute `imports` path names the drop-in under test) and a
tmpfs covers /run (nothing of the host's containerd is used). What containerd really merged is read
back with `containerd config dump`; `ctr plugins ls` shows the CRI plugin loaded. Containers are
started through the CRI in test_cri_containerd.py (`ctr` has no CDI support in 1.7 or 2.1: CDI
devices are resolved only by the CRI plugin).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from nodeprep.profile import Runtime
from nodeprep.runtime import containerd as ctd
from nodeprep.runtime.files import apply_changes

from .criclient import containerd_bin

pytestmark = pytest.mark.slow

SCRIPT = r"""
set -e
B=$1; R=$2; W=$3
mount --bind "$R/etc/containerd" /etc/containerd
mount -t tmpfs tmpfs /run
"$B/containerd" --config /etc/containerd/config.toml config dump > "$W/dump.toml"
PATH="$B:$PATH" "$B/containerd" --config /etc/containerd/config.toml > "$W/containerd.log" 2>&1 &
pid=$!
i=0
while [ ! -S "$W/run/containerd.sock" ] && [ $i -lt 150 ]; do sleep 0.2; i=$((i+1)); done
"$B/ctr" --address "$W/run/containerd.sock" version > "$W/version.txt" 2>&1 || true
"$B/ctr" --address "$W/run/containerd.sock" plugins ls > "$W/plugins.txt" 2>&1 || true
kill "$pid"
wait "$pid" || true
"""


@pytest.mark.parametrize(("os_name", "major_minor", "cri_key"), [
    ("debian-13", "1.7", "io.containerd.grpc.v1.cri"),
    ("debian-sid", "2.1", "io.containerd.cri.v1.runtime"),
])
def test_containerd_starts_with_the_drop_in_merged(
    test_cache: Path, tmp_path: Path, os_name: str, major_minor: str, cri_key: str
) -> None:
    for tool in ("unshare", "dpkg-deb", "runc"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing (scripts/deps/join.apt)")
    if not Path("/etc/containerd").is_dir():
        pytest.fail("/etc/containerd is needed as a mount point (containerd package, scripts/deps/join.apt)")
    bindir = containerd_bin(test_cache, os_name)
    default = subprocess.run([bindir / "containerd", "config", "default"], capture_output=True, text=True,
                             check=True, timeout=60).stdout
    work = tmp_path / "ctd"
    work.mkdir()
    text = default
    for old, new in (("/var/lib/containerd", f"{work}/var"), ("/run/containerd", f"{work}/run"),
                     ("/opt/containerd", f"{work}/opt")):
        text = text.replace(old, new)
    root = tmp_path / "root"
    (root / "etc/containerd").mkdir(parents=True)
    (root / "etc/containerd/config.toml").write_text(text)
    apply_changes(ctd.plan_containerd(root, Runtime()))

    subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", SCRIPT, "sh", bindir, root, work],
        check=True, capture_output=True, timeout=180,
    )

    version = (work / "version.txt").read_text()
    server = version.split("Server:", 1)[-1]
    assert re.search(rf"Version:\s+v?{re.escape(major_minor)}\.", server), version  # the daemon answered
    plugins = (work / "plugins.txt").read_text()
    rows = [line.split() for line in plugins.splitlines()]
    cri = [w for w in rows if w[:2] == ["io.containerd.grpc.v1", "cri"]]
    assert cri and cri[0][-1] == "ok", plugins + (work / "containerd.log").read_text()[-3000:]
    dump = tomllib.loads((work / "dump.toml").read_text())
    table = dump["plugins"][cri_key]
    runtimes = table["containerd"]["runtimes"]
    assert runtimes["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    assert runtimes["nvidia"]["runtime_type"] == "io.containerd.runc.v2"
    assert "runc" in runtimes  # the main file's table survived the merge
    assert table["enable_cdi"] is True
    assert table["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
