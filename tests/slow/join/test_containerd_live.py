"""A real containerd daemon starts with the configuration nodeprep writes and loads the CRI plugin
with the nvidia runtime registered.

Debian's containerd (scripts/deps/join.apt) runs in a private mount namespace (unshare -m) in which
the temp root's /etc/containerd is bind-mounted over /etc/containerd, so the main config's absolute
`imports` path resolves to the drop-in under test. Its root, state and socket live in the temp
directory (changed in the test copy of `containerd config default` only; the drop-in does not touch
them). No container is started (there is no GPU and no nvidia-container-runtime here): the check is
that containerd accepts the merged configuration and reports what it will use.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from nodeprep import runner
from nodeprep.profile import Cluster, Runtime
from nodeprep.runtime import containerd as ctd
from nodeprep.runtime.files import apply_changes

pytestmark = pytest.mark.slow

SCRIPT = r"""
set -e
mount --bind "$1/etc/containerd" /etc/containerd
containerd --config /etc/containerd/config.toml >"$2/containerd.log" 2>&1 &
pid=$!
i=0
while [ ! -S "$2/ctd.sock" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
ctr --address "$2/ctd.sock" plugins ls >"$2/plugins.txt" 2>&1 || true
kill "$pid"
wait "$pid" || true
"""


def test_containerd_starts_with_the_nvidia_runtime(tmp_path: Path) -> None:
    for tool in ("containerd", "ctr", "unshare"):
        if runner.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/deps/join.apt)")
    if os.geteuid() != 0:
        pytest.skip("needs root for a private mount namespace")
    if not Path("/etc/containerd").is_dir():
        pytest.skip("/etc/containerd is needed as a mount point (containerd package)")
    default = runner.run(["containerd", "config", "default"], timeout=60).stdout
    work = tmp_path / "ctd"
    work.mkdir()
    text = re.sub(r'(?m)^root = ".*"$', f'root = "{work}/var"', default)
    text = re.sub(r'(?m)^state = ".*"$', f'state = "{work}/run"', text)
    text = text.replace('address = "/run/containerd/containerd.sock"', f'address = "{work}/ctd.sock"')
    root = tmp_path / "root"
    (root / "etc/containerd").mkdir(parents=True)
    (root / "etc/containerd/config.toml").write_text(text)
    apply_changes(
        ctd.plan_containerd(root, Runtime(default_runtime=True), Cluster(api_server="10.0.0.10:6443"))
    )

    runner.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", SCRIPT, "sh", root, work], timeout=120
    )

    plugins = (work / "plugins.txt").read_text()
    cri = [line.split() for line in plugins.splitlines() if line.split()[1:2] == ["cri"]]
    assert cri and cri[0][-1] == "ok", plugins
    log = (work / "containerd.log").read_text()
    started = [line for line in log.splitlines() if "Start cri plugin with config" in line]
    assert started, log[-2000:]
    assert "DefaultRuntimeName:nvidia" in started[0]
    nvidia = re.search(r"nvidia:\{Type:(\S+) .*?Options:map\[([^\]]*)\]", started[0])
    assert nvidia, started[0]
    assert nvidia.group(1) == "io.containerd.runc.v2"
    assert "BinaryName:/usr/bin/nvidia-container-runtime" in nvidia.group(2)
    assert "SystemdCgroup:true" in nvidia.group(2)  # aligned with cluster.cgroup_driver systemd
