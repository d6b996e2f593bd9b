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

    # The modules that validate the node profile: the one opt-out of the CA pin rule.
    PROFILE = r"""
options:
  insecure_skip_ca_verification:
    description:
      - Accept a kubeadm-mode profile without C(cluster.ca_cert_hashes), as C(nodeprep join
        --insecure-skip-ca-verification) does; the join then trusts the network. Avoid.
      - Set it like C(nodeprep_join)'s option of the same name (the roles pass one fleet setting).
    type: bool
    default: false
"""
