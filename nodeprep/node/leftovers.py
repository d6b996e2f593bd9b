"""What a driver run owns beside its versions: the leftovers of an interrupted run (cleaned at
the start of the next, under the lock) and the paths a run may write (created.note looks above them
for the folders it makes; uninstall removes them)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from ..atomicfile import clean_temporaries
from . import gpufacts, integration, kernelhook
from .layout import (
    TEMP_PREFIXES,
    Layout,
)

log = logging.getLogger(__name__)


def clean_leftovers(layout: Layout) -> list[Path]:
    """Remove what an interrupted run left behind (only names nodeprep creates)."""
    removed = clean_temporaries(layout.opt, TEMP_PREFIXES)
    if layout.opt.is_dir():
        for vdir in layout.opt.iterdir():
            if not vdir.name.startswith(".") and (vdir / "modules").is_dir():
                removed += clean_temporaries(vdir / "modules", TEMP_PREFIXES)
    owned = (
        layout.ld_conf,
        layout.modprobe_conf,
        layout.unit,
        layout.unit_wants,
        layout.persistenced_unit,
        layout.persistenced_wants,
        layout.fabricmanager_unit,
        layout.fabricmanager_wants,
        layout.state_file,
        layout.current,
    )
    for path in owned:
        if path.parent.is_dir():
            removed += clean_temporaries(path.parent, (f".tmp-{path.name}.", f".current-{path.name}."))
    base = layout.resolved("/lib/modules")
    for rel in integration.linked_kernels(layout):
        removed += clean_temporaries(base / rel / "updates" / "nodeprep", (".current-",))
    fw = layout.resolved("/lib/firmware/nvidia")
    if fw.is_dir():
        removed += clean_temporaries(fw, (".current-",))
    for p in removed:
        log.info("removed leftover of an interrupted run: %s", layout.node_path(p))
    return removed


def writes(layout: Layout, kernels: Sequence[str]) -> list[Path]:
    """Host paths an install or activation may write for `kernels` (not the entry points): what
    created.note looks above for folders it makes."""
    return [layout.opt / "current", layout.ld_conf, layout.modprobe_conf, layout.unit, layout.unit_wants,
            layout.persistenced_unit, layout.persistenced_wants, layout.fabricmanager_unit,
            layout.fabricmanager_wants,
            *(layout.module_links(rel) / "nvidia.ko" for rel in kernels),
            layout.resolved("/lib/firmware/nvidia") / "x", gpufacts.path(layout), layout.download_dir / "x",
            *(kernelhook.hook_path(layout, e) for e in kernelhook.EVENTS),
            layout.host_path(kernelhook.HOLD_FILE)]
