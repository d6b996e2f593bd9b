"""Node side: versioned driver roots under /opt/nvidia, atomic activate/rollback, ldconfig, modules,
device nodes, systemd unit, doctor. Library API (used by the CLI, bootstrap and Ansible modules):

    plan(root, store, version, ...) -> (State, InstallPlan)        what install would change
    install(root, store, version, hooks=..., ...) -> InstallResult(changed, ...)
    activate(root, version, hooks=..., ...) / rollback(root, hooks=...) -> ActivateResult(changed, ...)
    (hooks: what follows an activation above the node, nodeprep.join.activation.HOOKS; node/hooks.py)
    remove(root, version) -> RemoveResult(changed, ...)
    load_state(root) -> State(installed, active, previous)
    nodeprep.node.doctor.doctor(root, require_cuda=None, checks=None) -> DoctorReport(ok, checks, to_dict())
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:
    from .ops import ActivateResult, InstallResult, RemoveResult, activate, install, remove, rollback
    from .state import State, load_state

# Importing one submodule (e.g. nodeprep.node.fsutil from join) must not load the operations.
__getattr__ = lazy_exports(__name__, {
    **dict.fromkeys(
        ["ActivateResult", "InstallResult", "RemoveResult", "activate", "install", "remove", "rollback"],
        "ops",
    ),
    "State": "state",
    "load_state": "state",
})

__all__ = [
    "ActivateResult",
    "InstallResult",
    "RemoveResult",
    "State",
    "activate",
    "install",
    "load_state",
    "remove",
    "rollback",
]
