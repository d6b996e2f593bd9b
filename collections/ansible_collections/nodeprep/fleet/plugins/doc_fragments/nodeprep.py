# Copyright: nodeprep maintainers
# Apache-2.0
"""Documentation the nodeprep.fleet modules share (extends_documentation_fragment)."""

from __future__ import annotations


class ModuleDocFragment:
    # Every module: check and diff mode, POSIX, the authors. A module overrides an entry by
    # documenting it itself, or by a fragment it lists before this one (NO_DIFF): of two fragments
    # that document the same attribute, ansible-doc keeps the one listed first.
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

    # The modules that apply one section of the node profile file on the node and, with
    # state=absent, remove what it wrote (nodeprep_runtime: runtime, nodeprep_join: cluster).
    SECTION = r"""
options:
  profile:
    description: The node profile (path as the node sees it, under O(root)).
    type: str
    default: /etc/nodeprep/node.yaml
  state:
    description:
      - V(present) applies the profile's section (C(nodeprep runtime), C(nodeprep join)).
      - V(absent) removes what nodeprep wrote for it, as C(nodeprep uninstall) does (see the description).
    type: str
    choices: [present, absent]
    default: present
"""

    # The modules that report no diff (they change nothing, or nothing a diff could show). Listed
    # before nodeprep.fleet.nodeprep, whose diff_mode it overrides.
    NO_DIFF = r"""
attributes:
  diff_mode:
    support: none
"""

    # The modules that write or check the CLI wrapper (nodeprep_unpack, nodeprep_info).
    WRAPPER = r"""
options:
  interpreter:
    description: Python interpreter the wrapper runs.
    type: str
    default: /usr/bin/python3
"""
