# Copyright: nodeprep maintainers
# Apache-2.0
"""Documentation the nodeprep.fleet modules share (extends_documentation_fragment)."""

from __future__ import annotations


class ModuleDocFragment:
    # Every module: check and diff mode, POSIX, the authors. A module overrides an entry by
    # documenting it itself (for example diff_mode support none).
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
author:
  - nodeprep maintainers
"""

    # The modules that run on a node: where the library is, and the node's root.
    NODE = r"""
options:
  nodeprep_path:
    description: The nodeprep library on the node (the directory nodeprep_install unpacks, or a zipapp).
    type: path
    default: /usr/local/lib/nodeprep/lib
  root:
    description: Root of the node's filesystem.
    type: path
    default: /
"""
