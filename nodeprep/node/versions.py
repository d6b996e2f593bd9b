"""remove and list: the installed versions of a node (an inactive one deleted whole, renamed aside
first so a crash leaves no half-removed root)."""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..atomicfile import fsync_dir
from ..crash import crash_point
from . import entrypoints, integration
from .driverplan import (
    plan_remove,
)
from .layout import (
    Layout,
    check_version,
)
from .leftovers import clean_leftovers
from .lock import locked
from .state import State, load_state, save_state

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RemoveResult:
    version: str
    changed: bool
    removed: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "changed": self.changed, "removed": list(self.removed)}


def remove(root: Path, version: str) -> RemoveResult:
    """Delete an installed, inactive version (only what nodeprep installed for it)."""
    layout = Layout(Path(root))
    check_version(version)
    with locked(layout):
        clean_leftovers(layout)
        state = load_state(layout.root)
        if not plan_remove(state, version).remove:
            return RemoveResult(version=version, changed=False)
        entry = state.installed[version]
        removed: list[str] = []
        if integration.unlink_firmware(layout, version, entry.firmware_link):
            removed.append(str(entry.firmware_link))
        installed = {v: i for v, i in state.installed.items() if v != version}
        if state.active is None and state.entry_points:  # nothing active: no entry point has a target
            removed += entrypoints.unlink(layout, state.entry_points)
            state = replace(state, entry_points=())
        save_state(
            layout,
            replace(
                state, installed=installed, previous=None if state.previous == version else state.previous
            ),
        )
        vdir = layout.version_dir(version)
        doomed = layout.opt / f".removing-{version}-{os.getpid()}"
        os.rename(vdir, doomed)
        fsync_dir(layout.opt)
        crash_point("remove:renamed")
        shutil.rmtree(doomed)
        removed.append(layout.node_path(vdir))
    return RemoveResult(version=version, changed=True, removed=tuple(removed))


def list_versions(root: Path) -> State:
    return load_state(Path(root))
