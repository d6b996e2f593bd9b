#!/usr/bin/python
# Copyright: nodeprep maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nodeprep_driver
short_description: Install an NVIDIA driver version from a nodeprep artifact store and activate it
description:
  - Calls C(nodeprep.node.ops.install) (user space and the kernel modules for one kernel release into
    C(/opt/nvidia/<version>), verified against the store index and each artifact's manifest) and,
    with O(state=active), switches C(/opt/nvidia/current) atomically, writes the ld.so.conf.d,
    modprobe.d and systemd files and rebuilds the ld cache.
  - Writes the kernel hooks C(/etc/kernel/postinst.d/nodeprep) and C(/etc/kernel/postrm.d/nodeprep) and
    records the store in C(/var/lib/nodeprep/state.json), so a kernel package installed later gets the
    active driver's modules from the store before the reboot.
  - C(changed) is the library's own answer (something was unpacked, linked, written or switched).
  - O(state=absent) is C(nodeprep uninstall). Every driver version, C(/opt/nvidia/current), the unit,
    the kernel hooks, the ld.so.conf.d and modprobe.d entries, the entry points, and the containerd
    drop-in and CDI spec C(nodeprep runtime) wrote are removed, the containerd main file written
    back, and ldconfig and depmod run again; a file nodeprep did not write is left and named in a
    warning. In check mode it returns the plan and removes nothing.
  - In check mode nothing is fetched or written; the result is the library's install plan
    (C(nodeprep install --check)), which says what is missing for the version and kernel, whether
    C(current) would switch, which files of the activation would be rewritten and which kernel
    hook files would be written. The store's index is read when something is missing.
version_added: "0.1.0"
options:
  root:
    description:
      - Root of the node's filesystem.
      - Anything but V(/) installs into an image and never loads modules.
    type: path
    default: /
  version:
    description:
      - Full driver version, for example V(535.309.01) (the profile's C(driver.version)).
      - Required unless O(state=absent), O(branch) or O(gpus) is given. With O(branch), a version of it.
      - With O(gpus), checked against the GPUs by its supported-GPU list in the store.
    type: str
  branch:
    description:
      - Driver branch (its major number, for example V(580); the profile's C(driver.branch)). Without
        O(version), the O(branch_policy)'s version of the branch in the store with kernel modules for
        O(kernel) is installed (of those that run O(gpus) when given); a branch the store has no
        version of fails naming the branch and the store.
    type: str
  gpus:
    description:
      - GPUs the version (unless O(version) pins it) and flavour follow, by each version's
        C(supported-gpus.json) in the store (the profile's C(driver.gpus), C(nodeprep install --gpus)).
      - V(node) reads the NVIDIA PCI devices under O(root); else a comma list of PCI ids
        C(10de:DEVICE[:SUBVENDOR:SUBDEVICE]), for example V(10de:2335).
      - None of the versions running every GPU fails naming the GPUs and the versions tried.
    type: str
  branch_policy:
    description: Which version O(gpus) or O(branch) takes, the newest or the oldest that fits.
    type: str
    choices: [newest, oldest]
    default: newest
  store:
    description:
      - Artifact store holding C(index.json) (directory, C(file://) or C(http(s\)://) base URL), or an OCI
        registry repository C(oci://HOST[:PORT]/REPO), optionally pinned as C(...@sha256:<index digest>).
      - Required unless O(state=absent).
    type: str
  registry_auth:
    description:
      - Docker-style C(config.json) on the node with the registry's credentials (mode 0600; refused
        otherwise). Never the credentials themselves.
    type: path
  ca_file:
    description: CA bundle (PEM) on the node that signs the store's TLS certificate.
    type: path
  insecure_http:
    description: Allow plain http (C(http://), C(oci+http://)) to a store that is not on loopback.
    type: bool
    default: false
  state:
    description:
      - V(present) installs only; V(active) also makes it the active driver.
      - V(absent) uninstalls nodeprep's driver and everything it wrote for it (C(nodeprep uninstall)).
    type: str
    choices: [present, active, absent]
    default: active
  kernel:
    description:
      - Kernel release to install modules for; default the running kernel.
      - Required when O(root) is not V(/).
    type: str
  flavour:
    description:
      - Kernel module flavour; default whichever the store has for the version and kernel.
      - With O(gpus), the preferred one (a GPU that needs the other decides).
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
    default: [nvidia, nvidia-uvm, nvidia-modeset]
  gpudirect:
    description:
      - GPUDirect modules loaded after nvidia and O(modules) (the profile's C(driver.gpudirect)).
        C(nvidia-fs) and C(gdrdrv) need a kmod artifact built with them (C(build-driver --nvidia-fs),
        C(--gdrcopy)); C(/dev/gdrdrv) is made on load. C(nvidia-peermem) loads only where the
        InfiniBand stack exports C(ib_register_peer_memory_client); elsewhere one line says DMA-BUF
        is the path.
    type: list
    elements: str
    choices: [nvidia-peermem, nvidia-fs, gdrdrv]
    default: []
  persistenced:
    description:
      - Run the active driver's nvidia-persistenced (unit C(nodeprep-persistenced.service); the profile's
        C(driver.persistenced)). V(false) writes no unit and removes one nodeprep wrote.
    type: bool
    default: true
  fabricmanager:
    description:
      - Run the active driver's Fabric Manager (unit C(nodeprep-fabricmanager.service); the profile's
        C(driver.fabricmanager)). V(auto) where the machine needs it (NVSwitches or their management
        bridge on PCI, never GB200/GB300), V(always), or V(never) (no unit; one nodeprep wrote is removed).
    type: str
    choices: [auto, always, never]
    default: auto
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
  keep_boot_kernel:
    description:
      - When a kernel package installed later has no modules of the active driver in the store, the
        kernel hook keeps the boot default (GRUB, C(/etc/default/grub.d/zz-nodeprep-keep-kernel.cfg)) on
        a kernel that has them. Without it the hook only prints one line.
    type: bool
    default: false
extends_documentation_fragment:
  - nodeprep.fleet.nodeprep
  - nodeprep.fleet.nodeprep.node
"""

EXAMPLES = r"""
- name: NVIDIA driver | Ensure 535.309.01 is installed and active
  nodeprep.fleet.nodeprep_driver:
    version: "535.309.01"
    store: https://artifacts.example.com/nvidia

- name: NVIDIA driver | The newest 580 driver that runs this node's GPUs
  nodeprep.fleet.nodeprep_driver:
    branch: "580"
    gpus: node
    store: https://artifacts.example.com/nvidia
"""

RETURN = r"""
preflight:
  description: >-
    With O(doctor), the doctor's findings on the node as it is now (the gate the real run ends with),
    also shown as warnings; check mode does not fail on them.
  returned: check mode
  type: list
  elements: str
version:
  description: The requested version (with O(gpus) or O(branch), the one chosen).
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
plan:
  description:
    - With O(state=absent), the uninstall plan (C(changes), C(remove), C(restore), C(kept), C(commands),
      C(notes)), as C(nodeprep uninstall --check --json) prints it.
    - The library's install plan (C(changes), C(install_userspace), C(install_kmod), C(activation) with
      C(switch) and C(rewrite), C(notes)), as C(nodeprep install --check --json) prints it.
  returned: in check mode
  type: dict
removed:
  description: Node paths removed (in check mode, that would be removed), with O(state=absent).
  returned: when O(state=absent)
  type: list
  elements: str
restored:
  description: Node paths of files nodeprep had edited, written back, with O(state=absent).
  returned: when O(state=absent)
  type: list
  elements: str
kept:
  description: Files at paths nodeprep writes that nodeprep did not write, left (also warnings).
  returned: when O(state=absent)
  type: list
  elements: str
doctor:
  description: The doctor gate run in this call (C(ok), C(checks)).
  returned: when O(doctor) is set and nothing changed
  type: dict
"""

from ansible_collections.nodeprep.fleet.plugins.module_utils.nodeprep_op_driver import main

if __name__ == "__main__":
    main()
