"""Vocabularies shared by every front-end, each spelled once.

The CLI options, the profile (and its JSON Schema), the library's checks and, through a drift test
(tests/unit/fleet/test_vocab_drift.py), the Ansible argument specs and role defaults all come from
these constants. Ansible's YAML and module DOCUMENTATION cannot import Python at lint time, so they
repeat the values and the test fails when they differ.
"""

from __future__ import annotations

import re
from typing import Literal

from .pci import NVIDIA_VENDOR_ID

# Validation patterns: always applied with fullmatch (`$` alone also matches before a trailing
# newline); their `^...$` text is what the JSON Schemas publish (ECMA-262 `$` is the end).
DRIVER_VERSION = r"\d{3}\.\d{2,3}(\.\d{2})?"  # a full driver version, 535.309.01 (for patterns that embed it)
DRIVER_VERSION_RE = re.compile(rf"^{DRIVER_VERSION}$")
DRIVER_REQUEST_RE = re.compile(r"^\d{3}(\.\d{2,3}(\.\d{2})?)?$")  # what a build asks for: 535, 535.309.01
KERNEL_RELEASE_RE = re.compile(r"^\d{1,4}\.\d{1,4}[A-Za-z0-9.+_~-]{0,120}$")  # 6.1.0-28-amd64
DRIVER_BRANCH_RE = re.compile(r"^\d{3}$")  # a driver branch: the major number of its versions, 580
# The GPUs a driver is chosen for: 'node' (the node's NVIDIA PCI devices) or a comma list of PCI ids
# (10de:DEVICE[:SUBVENDOR:SUBDEVICE], nodeprep.node.support.PciId)
_PCI_ID = rf"{NVIDIA_VENDOR_ID}:[0-9a-fA-F]{{4}}(:[0-9a-fA-F]{{4}}:[0-9a-fA-F]{{4}})?"
GPUS_RE = re.compile(rf"^(node|{_PCI_ID}(,{_PCI_ID})*)$")
# Which version of those that run the GPUs (or of a branch) is taken
BRANCH_POLICIES = ("newest", "oldest")


def driver_branch(version: str) -> str:
    """The branch of a driver version: its major number (580.95.05 -> 580)."""
    return version.split(".", 1)[0]


def version_key(version: str) -> tuple[int, ...]:
    """Sort key of a driver version or kernel release: its runs of digits as numbers, so 535.99.01 <
    535.104.05 and 6.1.0-9-amd64 < 6.1.0-28-amd64 (a text without digits sorts first)."""
    return tuple(int(p) for p in re.findall(r"\d+", version))


# Kernel modules an artifact may ship, in load order (nvidia first: the others depend on it);
# nvidia-fs (GPUDirect Storage) and gdrdrv (gdrcopy) are built beside the driver when asked for.
KERNEL_MODULES = ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm", "nvidia-peermem", "nvidia-fs",
                  "gdrdrv")
# The GPUDirect modules a profile may choose (driver.gpudirect, default none), in load order, after nvidia.
GPUDIRECT_MODULES = ("nvidia-peermem", "nvidia-fs", "gdrdrv")
# Where a node runs Fabric Manager (driver.fabricmanager): auto = where the machine needs it (the unit's
# ExecCondition, nodeprep.node.fabric), always, never (no unit). The first is the default.
FABRICMANAGER_MODES = ("auto", "always", "never")

# What a GPU compute node loads by default: the control and GPU devices (nvidia), CUDA's unified
# memory (nvidia-uvm) and /dev/nvidia-modeset (nvidia-modeset). nvidia-drm is the display (DRM/KMS)
# driver: it pulls in drm and drm_kms_helper, makes /dev/dri, and when it sets modes (a console
# framebuffer) it holds nvidia-modeset and nvidia, so a driver switch can no longer replace the
# loaded modules without a reboot; nvidia-peermem is for GPUDirect RDMA only. Both are opt-in.
DEFAULT_MODULES = ("nvidia", "nvidia-uvm", "nvidia-modeset")

Flavour = Literal["proprietary", "open"]
# Kernel module flavours: NVIDIA's proprietary modules, or the open GPU kernel modules (Turing+).
FLAVOURS: tuple[Flavour, ...] = ("proprietary", "open")
DEFAULT_FLAVOUR: Flavour = "proprietary"
