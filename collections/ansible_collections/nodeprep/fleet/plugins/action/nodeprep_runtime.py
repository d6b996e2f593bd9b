# Copyright: nodeprep maintainers
# Apache-2.0
"""nodeprep_runtime runs on the node as nodeprep_node, operation runtime: one module payload per run."""

from __future__ import annotations

from ansible_collections.nodeprep.fleet.plugins.plugin_utils.nodeprep_node_action import NodeprepNodeAction


class ActionModule(NodeprepNodeAction):
    OPERATION = "runtime"
