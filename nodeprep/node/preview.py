"""What `activate`, `rollback` and `remove` would change on this root (their `--check`): the pure
plans of nodeprep.node.driverplan over the node's state now; nothing is locked or written."""

from __future__ import annotations

from pathlib import Path

from ..profile.model import DEFAULT_DAEMONS, Daemons
from ..vocab import DEFAULT_MODULES
from . import integration
from .driverplan import ActivatePlan, RemovePlan, plan_activate, plan_remove, rollback_target
from .kmod import target_kernel
from .layout import Layout, check_version
from .state import load_state


def activation(root: Path, version: str | None, *, kernel: str | None = None,
               modules: tuple[str, ...] = DEFAULT_MODULES,
               daemons: Daemons = DEFAULT_DAEMONS) -> ActivatePlan:
    """activate VERSION (None: the rollback target), as switch.activate/switch.rollback would plan it."""
    layout = Layout(Path(root))
    state = load_state(layout.root)
    version = rollback_target(state) if version is None else check_version(version)
    live_kernel = target_kernel(layout, kernel) if layout.live else None
    return plan_activate(state, version, kernel=None if layout.live else kernel, live_kernel=live_kernel,
                         drift=integration.drift(layout, modules, daemons))


def removal(root: Path, version: str) -> RemovePlan:
    return plan_remove(load_state(Path(root)), check_version(version))
