"""Recorded data kept in the repository (tests/fixtures): the one place tests read it from."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
NVIDIA_SMI = FIXTURES / "nvidia-smi"  # real `nvidia-smi -q -x` captures, see SOURCES.md there
GPU_MACHINE = FIXTURES / "gpu-machine"  # what acceptance/gpu/ recorded on a real GPU, SOURCES.md there
DEBIAN_ARCHIVE = FIXTURES / "debian-archive"  # apt's answers recorded from Debian's archives (_comment)
