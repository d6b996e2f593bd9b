"""LabelOptions for a node's root and its profile's label settings: the one constructor every
front-end uses (`nodeprep labels`, join, bootstrap, the collection's nodeprep_labels), so a root's
facts are read by one rule."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..rootpath import beneath
from .core import LabelOptions
from .profilelabels import ProfileLabels


def label_options(root: Path, settings: ProfileLabels | None = None, **overrides: Any) -> LabelOptions:
    """The options that label the node at `root` with a profile's label settings (extra, cloud,
    kernel: `ProfileLabels.of(profile)`; the collection passes its own).

    The `--root` rule: the facts are the root's. Its sysfs is ROOT/sys resolved beneath the root
    (the one `doctor --root` reads; an image's link never leads to this host's /sys), the driver
    (NVML, nvidia-smi) is asked only when the root is the running system (for an image it would
    describe this host's GPUs), and the kernel is the profile's, else the root's
    (labels.system.root_kernel). `overrides` are LabelOptions fields; None keeps the default."""
    settings = settings or ProfileLabels()
    given = {k: v for k, v in overrides.items() if v is not None}
    live = os.path.realpath(root) == "/"
    rule: dict[str, Any] = {"root": Path(root), "cloud": settings.cloud, "extra": dict(settings.extra),
                            "kernel": settings.kernel, "use_nvml": live, "run_nvidia_smi": live}
    if "sysfs_root" not in given:
        rule["sysfs_root"] = beneath(Path(root), "/sys")
    return LabelOptions(**{**rule, **given})
