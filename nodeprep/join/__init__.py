"""Join a GPU node to Kubernetes: kubeadm JoinConfiguration / kubelet bootstrap, KubeletConfiguration,
containerd drop-in, CDI spec (docs/join.md).

Public API (CLI `nodeprep join`, Ansible roles kube_join and container_runtime, bootstrap):
    plan_runtime(profile, JoinOptions(root=...)) -> RuntimePlan      containerd + CDI only
    apply_runtime(plan) -> {"changed", "written", "ran", "warnings"}
    plan_join(profile, JoinOptions(...)) -> JoinPlan                 everything, nothing written
    apply_join(plan, run=True) -> dict                               write files, run commands
    preview_join(plan, output_dir=None) -> dict                      dry run: write nothing (or under DIR)
    join(profile, options, dry_run=False) -> (JoinPlan, dict)
Each plan holds FileChange objects (`target`, `content`, `mode`, `changed`, `secret`) and Actions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

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
        preview_join,
    )

# Driver activation imports nodeprep.join.cdi on every run; it must not pay for the planner.
__getattr__ = lazy_exports(__name__, {
    "FileChange": "files",
    **dict.fromkeys(
        ["Action", "JoinOptions", "JoinPlan", "RuntimePlan", "apply_join", "apply_runtime", "join",
         "plan_join", "plan_runtime", "preview_join"],
        "plan",
    ),
})

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
    "preview_join",
]
