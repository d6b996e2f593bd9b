"""Node side: versioned driver roots under /opt/nvidia, atomic activate/rollback, ldconfig, modules,
device nodes, systemd unit, doctor. Library API (used by the CLI, bootstrap and Ansible modules);
import each name from its module (this package imports nothing, so that loading one submodule, e.g.
nodeprep.node.fsutil from join, does not load the operations):

    nodeprep.node.ops.plan(root, store, version, ...) -> (State, InstallPlan)   what install would change
    nodeprep.node.ops.install(root, store, version, hooks=..., ...) -> InstallResult(changed, ...)
    nodeprep.node.ops.activate(root, version, hooks=..., ...) / rollback(root, hooks=...)
        -> ActivateResult(changed, ...)
    (hooks: what follows an activation above the node, nodeprep.join.activation.CALLBACKS; node/callbacks.py)
    nodeprep.node.ops.remove(root, version) -> RemoveResult(changed, ...)
    nodeprep.node.state.load_state(root) -> State(installed, active, previous)
    nodeprep.node.doctor.doctor(root, require_cuda=None, checks=None) -> DoctorReport(ok, checks, to_dict())
"""
