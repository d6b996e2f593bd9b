"""NVIDIA's open companion sources (nvidia-persistenced at driver versions, nvidia-fs, gdrcopy), each a
`git archive` of its upstream tag, found through one variable, `NODEPREP_NVIDIA_COMPANIONS`
(`.ci/run` points it at ../shared/nvidia-companions when that is beside the clone; without it the
tests that need them skip, saying why). Each archive is checked against its pinned sha256 before use.
"""

from __future__ import annotations

from pathlib import Path

from tests.support import binaries

ENV = "NODEPREP_NVIDIA_COMPANIONS"
_PERSISTENCED = "nvidia-persistenced-{}.tar.gz"
ARCHIVES = {
    _PERSISTENCED.format("535.309.01"): "aa0c97d24acb7b8e1ee3eb4d397c69ccf6c5f938e18f6ba50fd249307c476214",
    _PERSISTENCED.format("555.58.02"): "fa579a8b73c0b0dd2a4268ba34faf5eed00efa923e018cd65e0462528ea22522",
    _PERSISTENCED.format("580.142"): "99764778c908e8d4ed9e419da1c4e7dbae2d7e3f8f98652f032e41beb9532226",
    _PERSISTENCED.format("595.45.04"): "e4fd461efc0ef15a74f15e8771982dc981526da3df6a96b129f289d4f89a3896",
    "gds-nvidia-fs-2.28.4.tar.gz": "8b14509090e6187332d96d31249cf7e8977c3e19410a41b7583cb27b2365d556",
    "gdrcopy-2.6.tar.gz": "5eb7a433415cb2005c456c4a48899aef604752a5fa7f4e7c435107e12a2353e4",
}


def archive(name: str) -> Path | str:
    """The path of archive `name`, sha256-checked, or why it is not at hand (a skip reason)."""
    return binaries.pinned(ENV, "NVIDIA's companion sources (.ci/run: ../shared/nvidia-companions)", name,
                           ARCHIVES[name], ": sha256 differs from the pinned one")
