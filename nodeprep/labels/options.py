"""LabelOptions for a node's root and its profile's label settings: the one constructor every
front-end uses (`nodeprep labels`, join, bootstrap, the collection's nodeprep_labels), so a root's
facts are read by one rule."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..rootpath import beneath
from .core import LabelOptions
from .gpu import find_nvidia_smi
from .profilelabels import ProfileLabels


def label_options(root: Path, settings: ProfileLabels | None = None, **overrides: Any) -> LabelOptions:
    """The options that label the node at `root` with a profile's label settings (extra, cloud,
    kernel: `ProfileLabels.of(profile)`; the collection passes its own).

    The `--root` rule: the facts are the root's. Its sysfs is ROOT/sys resolved beneath the root
    (the one `doctor --root` reads; an image's link never leads to this host's /sys), the driver
    (NVML, nvidia-smi) is asked only when the root is the running system (for an image it would
    describe this host's GPUs), and the kernel is the profile's, else the root's
    (labels.system.root_kernel). When a named source asks the driver under an image anyway, the
    driver is this host's: whether it is loaded is read from the operator's sysfs_root, else this
    host's /sys (never the image's), and nothing under the image is run (gpu.find_nvidia_smi).
    `overrides` are LabelOptions fields; None keeps the default."""
    settings = settings or ProfileLabels()
    given = {k: v for k, v in overrides.items() if v is not None}
    live = os.path.realpath(root) == "/"
    rule: dict[str, Any] = {"root": Path(root), "cloud": settings.cloud, "extra": dict(settings.extra),
                            "kernel": settings.kernel, "use_nvml": live, "run_nvidia_smi": live,
                            "mig_strategy": settings.mig_strategy}
    if "sysfs_root" not in given:
        rule["sysfs_root"] = beneath(Path(root), "/sys")
        rule["driver_sysfs"] = None if live else Path("/sys")
    return LabelOptions(**{**rule, **given})


def source_refusal(root: Path, source: str) -> str | None:
    """Why `labels --root ROOT --source SOURCE` cannot be asked at all (one line), or None: under an
    image, `nvidia-smi` is this host's or none, never the image's own (#35)."""
    if source != "nvidia-smi" or os.path.realpath(root) == "/" or find_nvidia_smi(Path(root)) is not None:
        return None
    return (f"--source nvidia-smi with --root {root}: this host has no nvidia-smi on PATH, and the one "
            "under --root is never run (it is the image's program, not this host's)")
