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
