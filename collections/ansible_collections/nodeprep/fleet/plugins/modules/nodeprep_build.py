#!/usr/bin/python
# Copyright: nodeprep maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nodeprep_build
short_description: Build an NVIDIA kernel module artifact (and user space) into a nodeprep store
description:
  - Calls C(nodeprep.build.driver.build_driver) with a C(BuildRequest) - the same function as
    C(nodeprep build-driver) - and publishes the artifacts into the store directory O(store).
  - The build is keyed by its input digest; when the store already has the artifact of the same
    inputs nothing is compiled and C(changed) is false (the library's C(cached) answer).
  - Check mode compiles nothing; it reports C(changed) unless the store index already lists an
    artifact of that name (the input digest is not recomputed in check mode).
version_added: "0.1.0"
options:
  nodeprep_path:
    description: The nodeprep library on the node (the directory nodeprep_install unpacks, or a zipapp).
    type: path
    default: /usr/local/lib/nodeprep/lib
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
  diff_mode:
    support: none
  platform:
    platforms: posix
author:
  - nodeprep maintainers
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

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.nodeprep.fleet.plugins.module_utils.nodeprep_host import (
    COMMON_ARGUMENT_SPEC,
    fail_from,
    import_nodeprep,
    nodeprep_errors,
)


def argument_spec():
    spec = dict(COMMON_ARGUMENT_SPEC)
    spec.update(
        driver={"type": "str"},
        flavour={"type": "str", "choices": ["proprietary", "open"], "default": "proprietary"},
        os_name={"type": "str", "default": "debian-12"},
        kernel={"type": "str"},
        arch={"type": "str", "default": "amd64"},
        store={"type": "path", "required": True},
        cache={"type": "path", "default": "/var/cache/nodeprep"},
        userspace={"type": "bool", "default": True},
        smoke_test={"type": "bool"},
        jobs={"type": "int"},
        rebuild={"type": "bool", "default": False},
    )
    return spec


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    p = module.params
    driver_mod, artifact = import_nodeprep(module, "nodeprep.build.driver", "nodeprep.artifact")
    from pathlib import Path

    if module.check_mode:
        listed = False
        if p["driver"] and p["kernel"] and Path(p["store"], "index.json").is_file():
            name = artifact.artifact_name(
                "kmod", p["driver"], arch=p["arch"], flavour=p["flavour"], kernel_release=p["kernel"]
            )
            listed = artifact.LocalStore(Path(p["store"])).lookup(name) is not None
        module.exit_json(changed=not listed or p["rebuild"], cached=listed)
    try:
        req = driver_mod.BuildRequest(
            driver=p["driver"] or None,
            flavour=p["flavour"],
            os_name=p["os_name"],
            kernel=p["kernel"] or None,
            arch=p["arch"],
            store=Path(p["store"]),
            cache=Path(p["cache"]),
            jobs=p["jobs"],
            rebuild=p["rebuild"],
            userspace=p["userspace"],
            smoke_test=p["smoke_test"],
        )
        result = driver_mod.build_driver(req)
    except nodeprep_errors(module) as e:
        fail_from(module, e)
    module.exit_json(changed=not result.cached, cached=result.cached, build=result.to_dict())


if __name__ == "__main__":
    main()
