"""Join a GPU node to Kubernetes: kubeadm JoinConfiguration / kubelet bootstrap, KubeletConfiguration
(docs/join.md), over the container runtime's configuration (nodeprep.runtime: containerd, CDI).

Public API (CLI `nodeprep join`, Ansible roles kube_join and container_runtime, bootstrap): plans in
nodeprep.join.joinplan (what they read from the node: nodeprep.join.probe), applies in nodeprep.join.apply
(this package imports nothing: driver activation imports nodeprep.runtime.cdi on every run and must
not pay for the planner):
    plan.plan_join(profile, JoinOptions(...)) -> JoinPlan            everything, nothing written
    apply.apply_join(plan, run=True) -> dict                          write files, run commands
    apply.preview_join(plan, output_dir=None) -> dict                 dry run: write nothing (or under DIR)
    apply.join(profile, options, dry_run=False) -> (JoinPlan, dict)
Each plan holds FileChange objects (nodeprep.runtime.files: `target`, `content`, `mode`, `changed`,
`secret`) and Actions.
"""
