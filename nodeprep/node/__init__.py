"""Node side: versioned driver roots under /opt/nvidia, atomic activate/rollback, ldconfig, modules,
device nodes, systemd unit, doctor. Library API (used by the CLI, bootstrap and Ansible modules);
import each name from its module (this package imports nothing, so that loading one submodule, e.g.
nodeprep.node.layout from join, does not load the operations):

    nodeprep.node.driververbs: install_driver, activate_driver, uninstall_node (every front-end's call)
    nodeprep.node.installer.plan(root, store, version, ...) -> (State, InstallPlan): what install changes
    nodeprep.node.installer.install(root, InstallInput, callbacks=...) -> InstallResult(changed, ...)
    nodeprep.node.switch.activate(root, version, callbacks=..., ...) / rollback(root, callbacks=...)
        -> ActivateResult(changed, ...)
    (callbacks: what follows an activation above the node, nodeprep.join.activation.CALLBACKS)
    nodeprep.node.versions.remove(root, version) -> RemoveResult(changed, ...)
    nodeprep.node.uninstall.uninstall(root, callbacks=...) -> UninstallResult(changed, ...)
    nodeprep.node.state.load_state(root) -> State(installed, active, previous)
    nodeprep.node.doctor.doctor(root, require_cuda=None, checks=None) -> DoctorReport(ok, checks, to_dict())
"""
