"""Labels = GFD on NVIDIA's NVML mock (issue 39, item 4): on each of the mock's seven machines (A100,
HGX H100, B200, GB200, GB300, L40S, T4) and on profiles derived from them (tests/fixtures/mocknvml:
fabric not complete, GPUs disagreeing on the fabric, MIG mode on or pending), nodeprep's `nvidia.com/`
labels are exactly NVIDIA's real gpu-feature-discovery v0.20.0's, `nvidia.com/gpu.clique` included.

Uses the NVML mock, no GPU: GFD runs chrooted into a root whose `libnvidia-ml.so.1` is the mock's
library and whose `/mock-nvml.yaml` is the machine's profile (MOCK_NVML_CONFIG names it); nodeprep
runs as the real CLI (`labels --source nvml`, nvidia-ml-py) with LD_LIBRARY_PATH on the same library
and the same profile. Both see an empty PCI sysfs and DMI (`gpu.mode` and `gpu.machine` `unknown`).
The only differences, both documented in docs/labels.md: GFD's `gfd.timestamp` (nodeprep leaves it
out: it would change the Node on every run) and nodeprep's own `gpu.present`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import mocknvml, nvidia
from tests.support.fixtures import REPO

pytestmark = pytest.mark.slow

NODEPREP_OMITS = {"nvidia.com/gfd.timestamp"}
NODEPREP_ONLY = {"nvidia.com/gpu.present"}
CLIQUE = "nvidia.com/gpu.clique"
FABRIC_CLUSTER = "00000000-0000-0000-0000-000000000001.0"  # the profiles' cluster UUID and clique 0
WITH_FABRIC = {"h100", "gb200", "gb300"}  # the profiles with an NVLink fabric (NVML fabric info)

# (profile, --mig-strategy, the clique label both must give, a warning nodeprep must give or None)
CASES = [(m, "none", FABRIC_CLUSTER if m in WITH_FABRIC else None, None) for m in mocknvml.MACHINES] + [
    ("h100-fabric-in-progress", "none", None, "NVLink fabric not complete on GPU 0, 1, 2, 3, 4, 5, 6, 7"),
    ("h100-fabric-one-in-progress", "none", FABRIC_CLUSTER,
     "NVLink fabric not complete on GPU 3 (In Progress)"),
    ("h100-fabric-clique-differs", "none", None, "clique ids 0, 7"),
    ("h100-fabric-cluster-differs", "none", None, "fabric IDs differ"),
    ("h100-mig-enabled", "none", FABRIC_CLUSTER, None),
    ("h100-mig-enabled", "single", FABRIC_CLUSTER, None),
    ("h100-mig-enabled", "mixed", FABRIC_CLUSTER, None),
    ("a100-mig-pending", "none", None, None),
]


@pytest.fixture(scope="module")
def gfd(test_cache: Path) -> Path:
    reason = nvidia.skip_reason() or mocknvml.skip_reason()
    if reason:
        pytest.skip(reason)
    return nvidia.nvidia_binaries(test_cache)["gpu-feature-discovery"]


def profile_of(name: str, work: Path) -> Path:
    return mocknvml.config(name) if name in mocknvml.MACHINES else mocknvml.derived(name, work / "profiles")


def gfd_labels(gfd: Path, profile: Path, strategy: str, work: Path,
               sysfs: Path | None = None) -> dict[str, str]:
    """GFD's labels, chrooted; its /sys is a copy of `sysfs` (None: an empty PCI bus)."""
    root = work / "gfd-root"
    nvidia.copy_into_root(root, gfd, "/gpu-feature-discovery")
    if sysfs is not None:
        shutil.copytree(sysfs, root / "sys")
    (root / "sys/bus/pci/devices").mkdir(parents=True, exist_ok=True)
    (root / "tmp").mkdir()
    lib = root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    lib.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(mocknvml.root() / mocknvml.LIBRARY, lib)
    shutil.copyfile(profile, root / "mock-nvml.yaml")
    argv = ["chroot", root, "/gpu-feature-discovery", "--oneshot", "--use-node-feature-api=false",
            f"--mig-strategy={strategy}", "-o", "/tmp/gfd"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                               "MOCK_NVML_CONFIG": "/mock-nvml.yaml"})
    assert done.returncode == 0, done.stderr
    return dict(line.split("=", 1) for line in (root / "tmp/gfd").read_text().splitlines() if line)


def nodeprep_labels(cache: Path, profile: Path, strategy: str,
                    work: Path) -> tuple[dict[str, str], list[str]]:
    sysfs, dmi, root = work / "sys", work / "dmi", work / "node"
    (sysfs / "bus/pci/devices").mkdir(parents=True)
    (sysfs / "module/nvidia").mkdir(parents=True)  # the driver is "loaded": NVML is asked
    dmi.mkdir()
    root.mkdir()
    env = mocknvml.env(cache, profile, {**os.environ, "PYTHONPATH": str(REPO)})
    done = subprocess.run([sys.executable, "-m", "nodeprep.cli", "labels", "--source", "nvml",
                           "--mig-strategy", strategy, "--sysfs-root", str(sysfs), "--dmi-root", str(dmi),
                           "--root", str(root), "--cloud", "none", "--format", "json"],
                          capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["sources"]["gpu"] == "nvml"
    return {k: v for k, v in out["labels"].items() if k.startswith("nvidia.com/")}, out["warnings"]


@pytest.mark.parametrize(("name", "strategy", "clique", "warning"), CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_nodeprep_labels_equal_gfds_on_the_nvml_mock(name: str, strategy: str, clique: str | None,
                                                     warning: str | None, gfd: Path, test_cache: Path,
                                                     tmp_path: Path) -> None:
    profile = profile_of(name, tmp_path)
    theirs = gfd_labels(gfd, profile, strategy, tmp_path)
    ours, warnings = nodeprep_labels(test_cache, profile, strategy, tmp_path)
    assert theirs["nvidia.com/gpu.count"]  # GFD labelled the GPUs, it did not stop early
    assert NODEPREP_OMITS <= set(theirs)
    assert {k: v for k, v in ours.items() if k not in NODEPREP_ONLY} == \
        {k: v for k, v in theirs.items() if k not in NODEPREP_OMITS}
    assert ours["nvidia.com/gpu.present"] == "true"
    assert theirs.get(CLIQUE) == ours.get(CLIQUE) == clique
    if warning:
        assert any(warning in w for w in warnings), warnings
    else:
        assert not [w for w in warnings if "fabric" in w], warnings
