"""Driver switch under running containers (podman 4.3; fixtures: conftest.py, gpunode.py).

`nodeprep activate` of the second installed version rewrites the CDI spec: a new container gets the
new version's files, a container already running keeps the files it was started with (its mounts
name the versioned root /opt/nvidia/<version>, not `current`) until it exits, and rollback restores
the first version. That every spec activation leaves behind names only existing files is checked by
the runtime itself: a bind mount of a missing source fails the container start."""

from __future__ import annotations

import pytest
import yaml

from .gpunode import INSPECT, GpuNode, Seen, cli
from .test_cdi_podman import active_files, assert_sees

pytestmark = pytest.mark.slow


def test_switch_new_containers_follow_running_ones_keep_their_version(
    gpu_node: GpuNode, versions: tuple[str, str]
) -> None:
    first, second = versions
    root = str(gpu_node.root)
    started = gpu_node.podman_run("debian", "sleep 600", detach=True, name="running")
    assert started.returncode == 0, started.stderr
    try:
        r = cli("activate", second, "--root", root, "--no-load")
        assert r.returncode == 0, r.stderr
        assert f"/etc/cdi/nvidia.yaml now mounts {second}" in r.stderr
        spec = yaml.safe_load((gpu_node.root / "etc/cdi/nvidia.yaml").read_text())
        hosts = [m["hostPath"] for m in spec["containerEdits"]["mounts"]]
        assert all(h.startswith(f"/opt/nvidia/{second}/") for h in hosts)

        new = gpu_node.podman_run("lib64", INSPECT)
        assert new.returncode == 0, new.stderr
        assert_sees(Seen.parse(new.stdout), gpu_node, second, "lib64")

        old = gpu_node.podman_exec("running", INSPECT)
        assert old.returncode == 0, old.stderr
        seen_old = Seen.parse(old.stdout)
        for lib, ident in active_files(gpu_node, first).items():
            assert seen_old.probe[lib][1] == ident  # still the first version's very files
        assert seen_old.mounts == [m for m in seen_old.mounts if m.endswith(f"/opt/nvidia/{first}/lib64")]

        r = cli("rollback", "--root", root, "--no-load")
        assert r.returncode == 0, r.stderr
        back = gpu_node.podman_run("debian", INSPECT)
        assert back.returncode == 0, back.stderr
        assert_sees(Seen.parse(back.stdout), gpu_node, first, "debian")
    finally:
        gpu_node.ns([*gpu_node.podman_base(), "rm", "--force", "--time", "0", "running"], check=False)
        cli("activate", first, "--root", root, "--no-load")  # the session's node stays on `first`
