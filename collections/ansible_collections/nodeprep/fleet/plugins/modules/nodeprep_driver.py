#!/usr/bin/python
# Copyright: nodeprep maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nodeprep_driver
short_description: Install an NVIDIA driver version from a nodeprep artifact store and activate it
description:
  - Calls C(nodeprep.node.installer.install) (user space and the kernel modules for one kernel release into
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
  # BEGIN generated from nodeprep/profile/fields.py by `python -m nodeprep.profile.generate --write`
  version:
    description: >-
      NVIDIA driver version to install, e.g. 535.309.01 (required unless driver.branch or
      driver.gpus chooses it; with driver.branch, a version of that branch) (the profile's
      C(driver.version)).
    type: str
  branch:
    description: >-
      Driver branch to install the newest (driver.branch_policy) version of that the store has
      (and that runs driver.gpus), e.g. 580 (the profile's C(driver.branch)).
    type: str
  gpus:
    description: >-
      GPUs the driver version and flavour follow, by each version's supported-GPU list in the
      store: node (the node's NVIDIA PCI devices) or 10de:DEVICE,... (the profile's
      C(driver.gpus)).
    type: str
  branch_policy:
    description: >-
      Which version driver.gpus or driver.branch takes: the newest or the oldest that fits (the
      profile's C(driver.branch_policy)).
    type: str
    choices: [newest, oldest]
    default: newest
  flavour:
    description: >-
      Kernel module flavour: proprietary or open (open GPU kernel modules, Turing and newer)
      (the profile's C(driver.flavour)).
    type: str
    choices: [proprietary, open]
  store:
    description: >-
      Artifact store: a directory, file:// or http(s):// base URL with index.json, or an OCI
      registry repository oci://HOST[:PORT]/REPO[@sha256:DIGEST] (the profile's
      C(driver.store)).
    type: str
  registry_auth:
    description: >-
      Docker-style config.json with the registry's credentials (mode 0600; never the credentials
      themselves in the profile) (the profile's C(driver.registry_auth)).
    type: path
  ca_file:
    description: >-
      CA bundle (PEM) for the store's TLS certificate (default: the system's CAs) (the profile's
      C(driver.ca_file)).
    type: path
  insecure_http:
    description: >-
      Allow plain http (http://, oci+http://) to a store that is not on loopback (the profile's
      C(driver.insecure_http)).
    type: bool
    default: false
  kernel:
    description: >-
      Kernel release to install modules for (default: the running kernel) (the profile's
      C(driver.kernel)).
    type: str
  modules:
    description: >-
      Kernel modules to load, in order (the profile's C(driver.modules)).
    type: list
    elements: str
    default: [nvidia, nvidia-uvm, nvidia-modeset]
  gpudirect:
    description: >-
      GPUDirect modules loaded after nvidia (default none): nvidia-fs (GPUDirect Storage) and
      gdrdrv (gdrcopy, makes /dev/gdrdrv) need an artifact built with them; nvidia-peermem loads
      only where the InfiniBand stack exports the peer-memory API, else DMA-BUF is the path (the
      profile's C(driver.gpudirect)).
    type: list
    elements: str
    choices: [nvidia-peermem, nvidia-fs, gdrdrv]
    default: []
  persistenced:
    description: >-
      Run the active driver's nvidia-persistenced (unit nodeprep-persistenced.service, default
      true); false: no unit, one nodeprep wrote is removed (the profile's
      C(driver.persistenced)).
    type: bool
    default: true
  fabricmanager:
    description: >-
      Run the active driver's Fabric Manager (unit nodeprep-fabricmanager.service): auto
      (default) where the machine needs it (NVSwitch or its management bridge on PCI, never
      GB200/GB300: `nodeprep fabric-manager --condition`), always, or never (no unit, one
      nodeprep wrote is removed) (the profile's C(driver.fabricmanager)).
    type: str
    choices: [auto, always, never]
    default: auto
  keep_boot_kernel:
    description: >-
      When a kernel installed later has no modules in the store, the kernel hook keeps the boot
      default (GRUB) on a kernel that has them (the profile's C(driver.keep_boot_kernel)).
    type: bool
    default: false
  # END generated
  state:
    description:
      - V(present) installs only; V(active) also makes it the active driver.
      - V(absent) uninstalls nodeprep's driver and everything it wrote for it (C(nodeprep uninstall)).
    type: str
    choices: [present, active, absent]
    default: active
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
