"""Join a GPU node to Kubernetes: kubeadm JoinConfiguration / kubelet bootstrap, KubeletConfiguration,
containerd drop-in, CDI spec (docs/join.md).

Public API (CLI `nodeprep join`, Ansible roles kube_join and container_runtime, bootstrap):
    plan_runtime(profile, JoinOptions(root=...)) -> RuntimePlan      containerd + CDI only
    apply_runtime(plan) -> {"changed", "written", "ran", "warnings"}
    plan_join(profile, JoinOptions(...)) -> JoinPlan                 everything, nothing written
    apply_join(plan, run=True) -> dict                               write files, run commands
    join(profile, options, dry_run=False) -> (JoinPlan, dict)
Each plan holds FileChange objects (`target`, `content`, `mode`, `changed`, `secret`) and Actions.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .files import FileChange
    from .plan import (
        Action,
        JoinOptions,
        JoinPlan,
        RuntimePlan,
        apply_join,
        apply_runtime,
        join,
        plan_join,
        plan_runtime,
    )

# Loaded on first use (PEP 562): driver activation imports nodeprep.join.cdi on every run and must
# not pay for the whole planner (containerd, kubeadm, token handling).
_EXPORTS = {
    "FileChange": "files",
    "Action": "plan",
    "JoinOptions": "plan",
    "JoinPlan": "plan",
    "RuntimePlan": "plan",
    "apply_join": "plan",
    "apply_runtime": "plan",
    "join": "plan",
    "plan_join": "plan",
    "plan_runtime": "plan",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)


__all__ = [
    "Action",
    "FileChange",
    "JoinOptions",
    "JoinPlan",
    "RuntimePlan",
    "apply_join",
    "apply_runtime",
    "join",
    "plan_join",
    "plan_runtime",
]
