"""Labels = GFD (issue 26, item 6): on every recorded capture in tests/fixtures/nvidia-smi, each
`nvidia.com/` label nodeprep sets has the value NVIDIA's real gpu-feature-discovery v0.20.0 gives.

GFD needs NVML, and there is no GPU here: it runs chrooted into a root whose `libnvidia-ml.so.1` is a
stand-in answering NVML's calls with the capture's facts (tests/support/nvidia.py `nvml_serving`:
name, memory, MIG mode, PCI ids, driver and CUDA versions read from the XML with ElementTree, compute
capability from NVIDIA's published table, which these captures do not hold). Both sides see the same
empty PCI sysfs and DMI, so `gpu.mode` is `unknown`, `gpu.machine` is `unknown` and `vgpu.present` is
`false` on both. nodeprep runs as the real CLI (`labels --nvidia-smi-xml`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nodeprep import runner
from tests.support import nvidia
from tests.support.fixtures import REPO

pytestmark = pytest.mark.slow

CAPTURES = ("a100-sxm4-80gb-mig_535.54.03.xml", "a10g_515.105.01.xml", "dual-rtx-a5000_590.44.01.xml",
            "rtx-pro-6000-blackwell-maxq_590.44.01.xml", "tesla-t4_515.105.01.xml")
# What nodeprep leaves out on purpose: GFD's run timestamp, and the compute capability where neither the
# capture nor pci.ids names it (the A10G's PCI id is masked; Debian 12's pci.ids predates device 2bb4).
NODEPREP_OMITS = {"nvidia.com/gfd.timestamp"}
COMPUTE = {"nvidia.com/gpu.compute.major", "nvidia.com/gpu.compute.minor"}
NODEPREP_ONLY = {"nvidia.com/gpu.present"}  # nodeprep's own key (docs/labels.md)


@pytest.fixture(scope="module")
def gfd(test_cache: Path) -> Path:
    return nvidia.nvidia_binaries_or_skip(test_cache)["gpu-feature-discovery"]


def gfd_labels(gfd: Path, capture: Path, work: Path) -> dict[str, str]:
    root = work / "gfd-root"
    nvidia.copy_into_root(root, gfd, "/gpu-feature-discovery")
    (root / "sys/bus/pci/devices").mkdir(parents=True)
    (root / "tmp").mkdir()
    src = work / "nvml.c"
    src.write_text(nvidia.nvml_serving(capture.read_bytes()))
    lib = root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    lib.parent.mkdir(parents=True, exist_ok=True)
    runner.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o", lib, src], timeout=60)
    argv = ["chroot", root, "/gpu-feature-discovery", "--oneshot", "--use-node-feature-api=false",
            "-o", "/tmp/gfd"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    assert done.returncode == 0, done.stderr
    return dict(line.split("=", 1) for line in (root / "tmp/gfd").read_text().splitlines() if line)


def nodeprep_labels(capture: Path, work: Path) -> dict[str, str]:
    sysfs, dmi, root = work / "sys", work / "dmi", work / "node"
    (sysfs / "bus/pci/devices").mkdir(parents=True)
    dmi.mkdir()
    root.mkdir()
    done = subprocess.run([sys.executable, "-m", "nodeprep.cli", "labels", "--nvidia-smi-xml", str(capture),
                           "--sysfs-root", str(sysfs), "--dmi-root", str(dmi), "--root", str(root),
                           "--cloud", "none", "--format", "json"],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    labels = json.loads(done.stdout)["labels"]
    return {k: v for k, v in labels.items() if k.startswith("nvidia.com/")}


@pytest.mark.parametrize("name", CAPTURES)
def test_every_gfd_key_nodeprep_sets_has_gfds_value(name: str, gfd: Path, nvidia_smi_fixtures: Path,
                                                    tmp_path: Path) -> None:
    capture = nvidia_smi_fixtures / name
    theirs = gfd_labels(gfd, capture, tmp_path)
    ours = nodeprep_labels(capture, tmp_path)
    assert theirs["nvidia.com/gpu.product"]  # GFD labelled the GPUs, it did not stop early
    assert {k: ours[k] for k in ours if k not in NODEPREP_ONLY} == {k: theirs.get(k) for k in ours
                                                                    if k not in NODEPREP_ONLY}
    left_out = set(theirs) - set(ours)
    assert left_out - COMPUTE == NODEPREP_OMITS
    assert not left_out & COMPUTE or name.startswith(("a10g", "rtx-pro-6000"))
    assert ours["nvidia.com/vgpu.present"] == theirs["nvidia.com/vgpu.present"] == "false"
