"""Node side: versioned driver roots under /opt/nvidia, atomic activate/rollback, ldconfig, modules,
device nodes, systemd unit, doctor. Library API (used by the CLI, bootstrap and Ansible modules):

    install(root, store, version, ...) -> InstallResult(changed, ...)
    activate(root, version, ...) / rollback(root) -> ActivateResult(changed, ...)
    remove(root, version) -> RemoveResult(changed, ...)
    load_state(root) -> State(installed, active, previous)
    nodeprep.node.doctor.doctor(root, require_cuda=None, checks=None) -> DoctorReport(ok, checks, to_dict())
"""

from .ops import ActivateResult, InstallResult, RemoveResult, activate, install, remove, rollback
from .state import State, load_state

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
