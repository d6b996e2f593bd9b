#!/usr/bin/python
# Copyright: nodeprep maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nodeprep_build
short_description: Build an NVIDIA kernel module artifact (and user space) into a nodeprep store
description:
  - Calls C(nodeprep.builder.driver.build_driver) with a C(BuildRequest) - the same function as
    C(nodeprep build-driver) - and publishes the artifacts into the store directory O(store).
  - The build is keyed by its input digest; when the store already has the artifact of the same
    inputs nothing is compiled and C(changed) is false (the library's C(cached) answer).
  - Check mode compiles nothing; it reports C(changed) unless the store index already lists an
    artifact of that name (the input digest is not recomputed in check mode).
version_added: "0.1.0"
options:
  root:
    description: Unused; accepted so every nodeprep module takes the same common options.
    type: path
    default: /
  driver:
    description: Exact driver version (V(535.309.01)) or branch (V(535)); empty for the newest.
    type: str
  flavour:
    description: Kernel module flavour.
    type: str
    choices: [proprietary, open]
    default: proprietary
  os_name:
    description: Target OS of the build root.
    type: str
    default: debian-12
  kernel:
    description: Kernel release to build for; empty for the OS's current default kernel.
    type: str
  arch:
    description: Target architecture.
    type: str
    default: amd64
  store:
    description: Store directory the artifacts are published into (index.json kept up to date).
    type: path
    required: true
  cache:
    description: Download and build-root cache directory.
    type: path
    default: /var/cache/nodeprep
  userspace:
    description: Also build the user-space artifact of the driver.
    type: bool
    default: true
  smoke_test:
    description:
      - Boot the target kernel in qemu and load the modules before publishing.
      - Default on when the smoke test is available.
    type: bool
  jobs:
    description: Parallel compile jobs; default the number of CPUs.
    type: int
  rebuild:
    description: Compile even when the store has an artifact of the same inputs.
    type: bool
    default: false
attributes:
  check_mode:
    support: partial
    details: Nothing is compiled; C(changed) is based on the artifact name in the store index.
extends_documentation_fragment:
  - nodeprep.fleet.nodeprep.no_diff
  - nodeprep.fleet.nodeprep
  - nodeprep.fleet.nodeprep.node
"""

EXAMPLES = r"""
- name: Driver build | Build 535.309.01 for Debian 12's kernel
  nodeprep.fleet.nodeprep_build:
    driver: "535.309.01"
    kernel: 6.1.0-41-amd64
    store: /srv/nodeprep/store
"""

RETURN = r"""
build:
  description: >-
    The library's build result (artifact, name, sha256, cached, compiled, input_digest and the
    manifest fields).
  returned: success
  type: dict
cached:
  description: The store already had the artifact of these inputs; nothing was compiled.
  returned: success
  type: bool
"""

from ansible_collections.nodeprep.fleet.plugins.module_utils.nodeprep_op_build import main

if __name__ == "__main__":
    main()
