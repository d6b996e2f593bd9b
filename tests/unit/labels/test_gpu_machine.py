"""Labels = GFD on a real GPU (issue 26, item 6): what NVIDIA's gpu-feature-discovery v0.20.0 wrote on
the NVIDIA H200 a gpu-check run met (tests/fixtures/gpu-machine/SOURCES.md), against the labels the real
CLI makes today from that machine's `nvidia-smi -q -x` capture, and against what nodeprep said there
through NVML. GFD and nodeprep differ by the documented keys only (docs/labels.md)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.clirunner import invoke
from tests.support.fixtures import GPU_MACHINE

GFD_ONLY = {"nvidia.com/gfd.timestamp"}  # GFD's run time
NODEPREP_ONLY = {"nvidia.com/gpu.present"}  # nodeprep's own key
# gpu.mode comes from the PCI class in sysfs, which a capture does not hold: `unknown` from a capture alone
SYSFS = {"nvidia.com/gpu.mode"}


def gfd_labels() -> dict[str, str]:
    text = (GPU_MACHINE / "h200_580.159.04.gfd.labels").read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if line)


def test_labels_from_the_h200_capture_are_gfds_on_that_gpu(empty_sysfs: Path, empty_root: Path) -> None:
    r = invoke("labels", "--cloud", "none", "--json", "--root", str(empty_root), "--sysfs-root",
               str(empty_sysfs), "--nvidia-smi-xml", str(GPU_MACHINE / "h200_580.159.04.xml"))
    assert r.exit_code == 0, r.output
    ours = {k: v for k, v in json.loads(r.stdout)["labels"].items() if k.startswith("nvidia.com/")}
    gfd = gfd_labels()
    assert set(gfd) - set(ours) == GFD_ONLY
    assert set(ours) - set(gfd) == NODEPREP_ONLY
    assert {k: ours[k] for k in gfd if k not in GFD_ONLY | SYSFS} == {k: gfd[k] for k in gfd
                                                                      if k not in GFD_ONLY | SYSFS}
    assert ours["nvidia.com/gpu.mode"] == "unknown" and gfd["nvidia.com/gpu.mode"] == "compute"
    assert ours["nvidia.com/gpu.product"] == "NVIDIA-H200" and ours["nvidia.com/vgpu.present"] == "false"


def test_nodeprep_through_nvml_on_the_h200_said_what_gfd_said() -> None:
    """The machine's own record (sysfs included): every shared key has GFD's value, gpu.mode too."""
    ours = json.loads((GPU_MACHINE / "h200_580.159.04.nodeprep-nvml.json").read_text())["labels"]
    ours = {k: v for k, v in ours.items() if k.startswith("nvidia.com/")}
    gfd = {k: v for k, v in gfd_labels().items() if k not in GFD_ONLY}
    assert {k: v for k, v in ours.items() if k not in NODEPREP_ONLY} == gfd
