"""The spec nodeprep writes when NVIDIA's nvidia-cdi-hook is installed, run by podman 4.3.

The NVIDIA Container Toolkit is not in Debian, so /usr/bin/nvidia-cdi-hook is a stand-in at this one
boundary: a shell script placed at that path — in the node root (so `nodeprep runtime --root` sees
the toolkit) and, for the runtime, on an overlay of /usr/bin inside the test's own mount namespace —
that records its argv and the OCI state it gets on stdin and does nothing else (the real one would
also refresh the image's ld cache). What is tested is nodeprep's side: the spec then carries
nodeprep's hook without --ldconfig, followed by NVIDIA's `update-ldcache`; the runtime runs both in
that order; a container refused by the CUDA requirement never reaches NVIDIA's hook; and the
libraries are found without any ld cache update (the mounts are in the loaders' default
directories). Everything else is as in test_cdi_podman.py (fixtures: conftest.py, gpunode.py)."""

from __future__ import annotations

import json

import pytest
import yaml

from .gpunode import INSPECT, GpuNode, Seen, cli
from .test_cdi_podman import LIB_DIR, REQUIRE_12_4, assert_sees

pytestmark = pytest.mark.slow

STAND_IN = """#!/bin/sh
# stand-in for NVIDIA's nvidia-cdi-hook (not in Debian): record argv and the OCI state, nothing else
printf '%s\\n' "$0" "$@" > {log}.args
cat > {log}.state
"""


def test_toolkit_hook_runs_after_nodeprep_and_nothing_needs_it(
    gpu_node: GpuNode, versions: tuple[str, str]
) -> None:
    work, root = gpu_node.work / "toolkit", gpu_node.root
    for d in ("binup", "binwork"):
        (work / d).mkdir(parents=True)
    log = work / "nvidia-cdi-hook"
    script = STAND_IN.format(log=log)
    for path in (root / "usr/bin/nvidia-cdi-hook", work / "binup/nvidia-cdi-hook"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(script)
        path.chmod(0o755)
    try:
        gpu_node.ns(["mount", "-t", "overlay", "overlay", "-o",
                     f"lowerdir=/usr/bin,upperdir={work}/binup,workdir={work}/binwork", "/usr/bin"])
        r = cli("runtime", "--root", str(root))
        assert r.returncode == 0, r.stderr
        spec = yaml.safe_load((root / "etc/cdi/nvidia.yaml").read_text())
        ours, nvidia = spec["containerEdits"]["hooks"]
        assert ours["args"][-2:] == ["--driver", versions[0]]  # no --ldconfig
        assert nvidia["args"] == ["nvidia-cdi-hook", "update-ldcache", "--folder", LIB_DIR]

        r = gpu_node.podman_run("lib64", INSPECT)
        assert r.returncode == 0, r.stderr
        assert_sees(Seen.parse(r.stdout), gpu_node, versions[0], "lib64")
        assert (work / "nvidia-cdi-hook.args").read_text().split("\n")[1:-1] == [
            "update-ldcache", "--folder", LIB_DIR]
        state = json.loads((work / "nvidia-cdi-hook.state").read_text())
        assert state["status"] == "creating" and (gpu_node.work / "podman").as_posix() in state["bundle"]

        (work / "nvidia-cdi-hook.args").unlink()
        refused = gpu_node.podman_run("debian", "echo started", env={"NVIDIA_REQUIRE_CUDA": REQUIRE_12_4})
        assert refused.returncode != 0 and "nodeprep: container refused" in refused.stderr
        assert not (work / "nvidia-cdi-hook.args").exists()  # hook #0 failed: #1 never ran
    finally:
        gpu_node.ns(["umount", "/usr/bin"], check=False)
        (root / "usr/bin/nvidia-cdi-hook").unlink(missing_ok=True)
        r = cli("runtime", "--root", str(root))
        assert r.returncode == 0, r.stderr
