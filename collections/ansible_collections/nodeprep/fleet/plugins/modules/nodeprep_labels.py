#!/usr/bin/python
# Copyright: nodeprep maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nodeprep_labels
short_description: Compute a GPU node's labels with nodeprep and write them where NFD and kubelet read them
description:
  - Calls C(nodeprep.node.labeling.label_node), the one call C(nodeprep labels) and bootstrap's labels
    step make - the labels of C(nodeprep.labels.core.node_labels) (facts from NVML, C(nvidia-smi -q -x),
    PCI sysfs, DMI and optionally the cloud metadata service) - and writes the labels as an NFD local
    feature file and as a JSON file with every label split into kubelet-settable and API-only ones.
  - On a root with an active driver (C(/opt/nvidia/current)) that call also records the GPU facts the
    CUDA gate reads, C(/opt/nvidia/gpu-facts.json) (each GPU's brand and compute capability, through
    C(nodeprep.node.gpufacts.record)); check mode only reports it.
  - C(changed) is true only when a file's content (or mode) differs.
version_added: "0.1.0"
options:
  root:
    description: Root directory of the node's filesystem (for images and chroots).
    type: path
    default: /
  extra:
    description: Extra labels (key to value); they win over derived ones and are validated.
    type: dict
    default: {}
  cloud:
    description: Which cloud metadata service to ask; V(none) asks none.
    type: str
    choices: [auto, aws, gce, azure, none]
    default: auto
  mig_strategy:
    description: GFD's MIG strategy for the labels.
    type: str
    choices: [none, single, mixed]
    default: none
  nvidia_smi_xml:
    description: Read GPU facts from this C(nvidia-smi -q -x) capture instead of asking the driver.
    type: path
  kernel:
    description: Kernel release to describe (default the running kernel).
    type: str
  nfd_file:
    description: NFD local feature file to write (C(key=value) lines); empty to skip.
    type: str
    default: /etc/kubernetes/node-feature-discovery/features.d/nodeprep
  json_file:
    description: JSON file with all labels and the kubelet/API split; empty to skip.
    type: str
    default: /var/lib/nodeprep/labels.json
extends_documentation_fragment:
  - nodeprep.fleet.nodeprep
  - nodeprep.fleet.nodeprep.node
"""

EXAMPLES = r"""
- name: Labels | Write the node labels
  nodeprep.fleet.nodeprep_labels:
    cloud: none
    extra:
      example.com/pool: gpu-a
"""

RETURN = r"""
labels:
  description: Every label of the node.
  returned: always
  type: dict
  sample: {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": "8"}
kubelet_labels:
  description: Labels the kubelet may set on itself at registration (NodeRestriction).
  returned: always
  type: dict
api_labels:
  description: Labels that need an API write.
  returned: always
  type: dict
sources:
  description: Which source gave each kind of fact.
  returned: always
  type: dict
gpu_facts:
  description: The GPU facts file beneath O(root) (written, or in check mode planned); null when there
    is none to record (no active driver at O(root), or no GPU facts).
  returned: always
  type: str
  sample: /opt/nvidia/gpu-facts.json
warnings_seen:
  description: Fact sources that were unavailable and labels that were dropped.
  returned: always
  type: list
  elements: str
"""

from ansible_collections.nodeprep.fleet.plugins.module_utils.nodeprep_op_labels import main

if __name__ == "__main__":
    main()
