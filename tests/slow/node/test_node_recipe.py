"""docs/node.md's "Try it" block, run as written: install two versions into a throwaway Debian 12
root, activate the second, roll back, look from inside the root, remove, throw the root away.

What the doc's step 1 builds is the session's real build (535.309.01, `real_build`) plus the second
version, Debian's tesla-535 user space 535.216.03 (`node_store`: real packages, its kmod the small
stand-in of tests/slow/node compiled for the same kernel: compiling the real 535.216.03 module would
cost the tier another 4 minutes and the switch never touches module contents). The root is the
cached mmdebstrap minbase root of the node tests.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from nodeprep import artifact
from tests.support.docs import documented_block
from tests.support.fixtures import REPO

from .helpers import V_NEW, V_OLD, NodeStore

pytestmark = pytest.mark.slow


def test_documented_recipe(real_build, node_store: NodeStore, rootfs: Path,  # type: ignore[no-untyped-def]
                           tmp_path: Path) -> None:
    block = documented_block("docs/node.md", "node-recipe")
    assert (real_build.driver_version, real_build.kernel_release) == (V_NEW, node_store.kernel), \
        "docs/node.md names 535.309.01: update it with the version the quick start builds now"
    store = artifact.LocalStore(tmp_path / "artifacts")
    for src, version in ((Path(real_build.store), V_NEW), (Path(node_store.path), V_OLD)):
        for path in sorted(src.glob("nvidia-*.tar.zst")):
            manifest = artifact.read_manifest(path)
            if manifest.driver_version == version:
                store.publish(path, manifest)
    env = {**os.environ, "STORE": str(store.path), "KERNEL": real_build.kernel_release, "ROOT": str(rootfs)}
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout.splitlines()
    assert [line for line in out if line in (V_NEW, V_OLD)] == [V_OLD, V_NEW]  # the two readlinks
    libcuda = [line for line in out if "libcuda.so.1 " in line]
    # the versioned root through `current`, and the entry point where NVIDIA's tools look (a link
    # through `current` too, listed by ldconfig under /lib or /usr/lib on a merged-/usr root)
    through_current = ("=> /opt/nvidia/current/lib64/libcuda.so.1", "=> /lib/x86_64-linux-gnu/libcuda.so.1",
                       "=> /usr/lib/x86_64-linux-gnu/libcuda.so.1")
    assert any(through_current[0] in line for line in libcuda), libcuda
    assert all(line.endswith(through_current) for line in libcuda), libcuda
    assert not rootfs.exists()
