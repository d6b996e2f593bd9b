#!/usr/bin/python
# Copyright: nodeprep maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nodeprep_driver
short_description: Install an NVIDIA driver version from a nodeprep artifact store and activate it
description:
  - Calls C(nodeprep.node.install) (user space and the kernel modules for one kernel release into
    C(/opt/nvidia/<version>), verified against the store index and each artifact's manifest) and,
    with O(state=active), switches C(/opt/nvidia/current) atomically, writes the ld.so.conf.d,
    modprobe.d and systemd files and rebuilds the ld cache.
  - C(changed) is the library's own answer (something was unpacked, linked, written or switched).
  - In check mode nothing is fetched or written; the state file is compared with the request.
version_added: "0.1.0"
options:
  nodeprep_path:
    description: The nodeprep library on the node (the directory nodeprep_install unpacks, or a zipapp).
    type: path
    default: /usr/local/lib/nodeprep/lib
  root:
    description:
      - Root of the node's filesystem.
      - Anything but V(/) installs into an image and never loads modules.
    type: path
    default: /
  version:
    description: Full driver version, for example V(535.309.01).
    type: str
    required: true
  store:
    description: Artifact store holding C(index.json) (directory, C(file://) or C(http(s\)://) base URL).
    type: str
    required: true
  state:
    description: V(present) installs only; V(active) also makes it the active driver.
    type: str
    choices: [present, active]
    default: active
  kernel:
    description:
      - Kernel release to install modules for; default the running kernel.
      - Required when O(root) is not V(/).
    type: str
  flavour:
    description: Kernel module flavour; default whichever the store has for the version and kernel.
    type: str
    choices: [proprietary, open]
  arch:
    description: Architecture of the user-space artifact.
    type: str
    default: amd64
  load:
    description:
      - Load the kernel modules after activating (live systems only). If another version's module is
        loaded it is left alone and RV(reboot_required) is set.
    type: bool
    default: false
  modules:
    description: Kernel modules to load, in order.
    type: list
    elements: str
    default: [nvidia, nvidia-uvm, nvidia-modeset, nvidia-drm]
  doctor:
    description:
      - When this call changes nothing, also run C(nodeprep doctor) in the same round trip and fail
        like C(nodeprep_doctor) on any problem (RV(doctor) is then returned). A call that changes the
        driver leaves the gate to a C(nodeprep_doctor) task after the handlers load the modules.
    type: bool
    default: false
  doctor_checks:
    description: Doctor checks to run with O(doctor); empty for all.
    type: list
    elements: str
    default: []
  require_cuda:
    description: CUDA version the driver must support, checked with O(doctor).
    type: str
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

EXAMPLES = r"""
- name: NVIDIA driver | Ensure 535.309.01 is installed and active
  nodeprep.fleet.nodeprep_driver:
    version: "535.309.01"
    store: https://artifacts.example.com/nvidia
"""

RETURN = r"""
version:
  description: The requested version.
  returned: always
  type: str
kernel:
  description: Kernel release the modules were installed for.
  returned: success
  type: str
active:
  description: Active version after the run (in check mode, the one that would be active).
  returned: always
  type: str
previous:
  description: Version that was active before.
  returned: always
  type: str
installed:
  description: Installed versions after the run.
  returned: always
  type: list
  elements: str
loaded:
  description: Whether the modules of the active version were loaded.
  returned: always
  type: bool
reboot_required:
  description: Modules were to be loaded but another version's module is loaded and could not be replaced.
  returned: always
  type: bool
notes:
  description: What the library noted (already installed, loading skipped, ...).
  returned: always
  type: list
  elements: str
doctor:
  description: The doctor gate run in this call (C(ok), C(checks)).
  returned: when O(doctor) is set and nothing changed
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.nodeprep.fleet.plugins.module_utils.nodeprep_host import (
    COMMON_ARGUMENT_SPEC,
    doctor_problems,
    fail_from,
    import_nodeprep,
    nodeprep_errors,
)

DEFAULT_MODULES = ["nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm"]


def argument_spec():
    spec = dict(COMMON_ARGUMENT_SPEC)
    spec.update(
        version={"type": "str", "required": True},
        store={"type": "str", "required": True},
        state={"type": "str", "choices": ["present", "active"], "default": "active"},
        kernel={"type": "str"},
        flavour={"type": "str", "choices": ["proprietary", "open"]},
        arch={"type": "str", "default": "amd64"},
        load={"type": "bool", "default": False},
        modules={"type": "list", "elements": "str", "default": list(DEFAULT_MODULES)},
        doctor={"type": "bool", "default": False},
        doctor_checks={"type": "list", "elements": "str", "default": []},
        require_cuda={"type": "str"},
    )
    return spec


def snapshot(state):
    return {
        "active": state.active,
        "installed": {v: sorted(i.kernels) for v, i in sorted(state.installed.items())},
    }


def predict(state, version, kernel, activate):
    """The state check mode reports: what install (+ activate) would leave behind."""
    installed = {v: sorted(i.kernels) for v, i in sorted(state.installed.items())}
    installed[version] = sorted(set(installed.get(version, [])) | ({kernel} if kernel else set()))
    return {"active": version if activate else state.active, "installed": installed}


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    p = module.params
    ops, state_mod, kmod = import_nodeprep(
        module, "nodeprep.node.ops", "nodeprep.node.state", "nodeprep.node.kmod"
    )
    from pathlib import Path

    root = Path(p["root"])
    activate = p["state"] == "active"
    try:
        before = state_mod.load_state(root)
        kernel = p["kernel"] or (kmod.running_kernel() if root.resolve() == Path("/") else None)
        if module.check_mode:
            after = predict(before, p["version"], kernel, activate)
            old = snapshot(before)
            module.exit_json(
                changed=after != old,
                version=p["version"],
                kernel=kernel,
                active=after["active"],
                previous=before.active,
                installed=sorted(after["installed"]),
                loaded=False,
                reboot_required=False,
                notes=["check mode: nothing fetched or written"],
                diff={"before": old, "after": after},
            )
        result = ops.install(
            root,
            p["store"],
            p["version"],
            kernel=p["kernel"],
            flavour=p["flavour"],
            arch=p["arch"],
            activate=activate,
            load=p["load"],
            modules=tuple(p["modules"]),
        )
        after = state_mod.load_state(root)
    except nodeprep_errors(module) as e:
        fail_from(module, e, version=p["version"])
    activation = result.activation
    loaded = bool(activation and activation.loaded)
    notes = list(result.notes) + (list(activation.notes) if activation else [])
    out = {
        "changed": result.changed,
        "version": result.version,
        "kernel": result.kernel,
        "active": after.active,
        "previous": before.active,
        "installed": sorted(after.installed),
        "loaded": loaded,
        "reboot_required": bool(activate and p["load"] and root.resolve() == Path("/") and not loaded),
        "notes": notes,
    }
    if module._diff:
        out["diff"] = {"before": snapshot(before), "after": snapshot(after)}
    if p["doctor"] and not result.changed:
        (doctor_mod,) = import_nodeprep(module, "nodeprep.node.doctor")
        try:
            problems, checks, _ = doctor_problems(
                doctor_mod, root, p["doctor_checks"], p["require_cuda"], p["version"] if activate else None
            )
        except nodeprep_errors(module) as e:
            fail_from(module, e, version=p["version"])
        out["doctor"] = {"ok": not problems, "checks": checks}
        if problems:
            module.fail_json(msg="doctor: " + "; ".join(problems), **out)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
