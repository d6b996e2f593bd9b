# Copyright: nodeprep maintainers
# Apache-2.0
"""Base of the node-side modules' action plugins: run the operation through the nodeprep_node module.

Ansible builds a module's payload (AnsiballZ) once per playbook run and module name, parsing
ansible-core's module_utils each time (~0.2 s of controller CPU). Sending one module for every
nodeprep task makes that one build per run instead of one per module a play uses.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible.utils.vars import merge_hash

NODE_MODULE = "nodeprep.fleet.nodeprep_node"


class NodeprepNodeAction(ActionBase):
    """Like ansible.builtin.normal, with the module swapped for nodeprep_node + the operation."""

    OPERATION = ""
    _supports_check_mode = True
    _supports_async = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        wrap_async = self._task.async_val and not self._connection.has_native_async
        args = dict(self._task.args, nodeprep_operation=self.OPERATION)
        result = merge_hash(
            result,
            self._execute_module(
                module_name=NODE_MODULE, module_args=args, task_vars=task_vars, wrap_async=wrap_async
            ),
        )
        if not wrap_async:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return result
