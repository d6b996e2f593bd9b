"""The label verb's use case: compute the node's labels from the root's facts (nodeprep.labels) and
record the CUDA gate's GPU facts beneath the root (node/gpufacts.py). `nodeprep labels`, bootstrap's
labels step and nodeprep.fleet.nodeprep_labels each make one request (the profile's label settings,
ProfileLabels, plus what the front-end adds) and call label_node, which owns every decision: where
the facts are read (the `--root` rule, labels/options.py), which GPU source, plan or record."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..containerhooks.gate import FACTS as GPU_FACTS
from ..errors import InputError, StateError
from ..labels.core import LabelOptions, LabelResult, node_labels
from ..labels.options import label_options, source_refusal
from ..labels.profilelabels import ProfileLabels
from .gpufacts import Recording, record

GPU_SOURCES = ("auto", "nvml", "nvidia-smi", "pci")  # pci: sysfs only, no driver asked


@dataclass(frozen=True)
class LabelNode:
    """Label the node. `settings`: the profile's label settings. `check`: the GPU facts are planned,
    not written; `activating`: an earlier step makes a driver active (bootstrap's driver step).
    `source`: where GPU facts come from (`auto`: NVML, then nvidia-smi, then PCI; a named one is the
    only one asked, its absence an error). `options`: LabelOptions fields over the `--root` rule's
    (None: the rule's)."""

    settings: ProfileLabels
    check: bool = False
    activating: bool = False
    source: str = "auto"
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Labelled:
    """The labels and their facts, and the GPU facts recorded (or, in check mode, planned; None:
    nothing to record, or `facts_warning` says why they were not written)."""

    options: LabelOptions
    result: LabelResult
    facts: Recording | None
    facts_warning: str | None = None


def label_node(root: Path, request: LabelNode) -> Labelled:
    """The labels of the node at `root`; the GPU facts recorded beneath it (planned with check)."""
    source = request.source
    named = {} if source == "auto" else {"use_nvml": source == "nvml",
                                         "run_nvidia_smi": source == "nvidia-smi"}
    opts = label_options(root, request.settings, **{**request.options, **named})
    if source != "auto" and request.options.get("nvidia_smi_xml") is not None:
        raise InputError("--source: not with --nvidia-smi-xml (the capture is the source)")
    if refusal := source_refusal(root, source):
        raise InputError(refusal, hint="put this host's nvidia-smi on PATH, or use --nvidia-smi-xml FILE "
                                       "or --source pci")
    result = node_labels(opts)
    if source != "auto" and result.sources["gpu"] != source:
        raise StateError(f"--source {source}: no GPU facts from it (got: {result.sources['gpu']}); "
                         + "; ".join(w for w in result.warnings if w.startswith("gpu:")),
                         hint="is the driver loaded? (nodeprep doctor)")
    if source != "auto" and (result.facts.gpu is None or not result.facts.gpu.gpus):
        raise StateError(f"--source {source}: no NVIDIA GPU found ({opts.sysfs_root}/bus/pci/devices "
                         "has no device with vendor 10de)" if source == "pci"
                         else f"--source {source}: no NVIDIA GPU found")
    try:  # advisory: without them the gate keeps CUDA forward compatibility off
        facts = record(root, result.facts.gpu, check=request.check, activating=request.activating)
    except OSError as e:
        return Labelled(opts, result, None, f"{GPU_FACTS}: GPU facts not written ({e})")
    return Labelled(opts, result, facts)
