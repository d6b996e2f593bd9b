"""The node bring-up steps of `nodeprep bootstrap`: thin adapters over the install (nodeprep.node),
labels (nodeprep.labels) and join (nodeprep.join) libraries, run by nodeprep.bootstrap.engine.

driver (install + activate from the store) -> modules (load + doctor) -> mig (the profile's MIG
layout, so the device plugin never sees a half-made one) -> labels -> runtime (containerd) -> join.
Each step is a function `Context -> dict` (its JSON-able result, with a one-line `summary`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..atomicfile import atomic_write
from ..containerhooks.gate import FACTS as GPU_FACTS
from ..errors import StateError
from ..join.activation import CALLBACKS
from ..join.joining import JoinRequest, join_cluster
from ..labels.output import render_nfd
from ..labels.profilelabels import ProfileLabels
from ..node.devices import load_modules
from ..node.doctor import doctor
from ..node.driververbs import DriverInstall, Planned, install_driver
from ..node.labeling import LabelNode, label_node
from ..node.migapply import run
from ..rootpath import beneath
from ..runtime.configure import RuntimeRequest, configure_runtime
from .engine import Step

if TYPE_CHECKING:
    from ..profile import Profile

log = logging.getLogger("nodeprep.bootstrap")


@dataclass(frozen=True)
class Options:
    """How bootstrap runs, beyond the profile (front-end flags)."""

    dry_run_join: bool = False
    # --check: every step plans and writes nothing (no record, no lock, no log); what would stop the
    # real run (doctor's findings, no active driver for the CDI spec yet) is a finding in `preflight`
    check: bool = False
    sysfs_root: Path | None = None  # where GPU/DMI facts are read (labels); None: ROOT/sys
    nvidia_smi_xml: Path | None = None  # GPU facts from this capture instead of asking the driver
    load_modules: bool | None = None  # None: only when root is / (never modprobe for an image)
    mig: bool | None = None  # put mig.config in place through this host's NVML; None: only when root is /
    nvml: bool | None = None  # label from this host's NVML (its GPUs are the root's); None: root is /


@dataclass(frozen=True)
class Context:
    """What a step sees: the target root, the loaded profile and the results of earlier steps."""

    root: Path
    profile: Profile
    profile_path: Path
    digest: str
    options: Options = field(default_factory=Options)
    results: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def dry_run_join(self) -> bool:
        return self.options.dry_run_join

    @property
    def check(self) -> bool:
        return self.options.check

    @property
    def live(self) -> bool:
        """True when operating on the running system (root is /)."""
        return self.root.resolve() == Path("/")


NFD_FEATURES = "/etc/kubernetes/node-feature-discovery/features.d/nodeprep"
LABELS_JSON = "/etc/nodeprep/labels.json"


def _under(root: Path, target: str) -> Path:
    return beneath(root, target, follow_last=False)


def _load(ctx: Context) -> bool:
    return ctx.live if ctx.options.load_modules is None else ctx.options.load_modules


def step_driver(ctx: Context) -> dict[str, Any]:
    """Install user space + kmod of driver.version (or of the version driver.branch / driver.gpus
    choose) from driver.store and make it the active root: nodeprep.node.driververbs.install_driver."""
    request = DriverInstall(ctx.profile.driver, activate=True, load=False, check=ctx.check,
                            sys_dir=ctx.options.sysfs_root, image_kernel=True)
    result = install_driver(ctx.root, request, callbacks=CALLBACKS)
    if isinstance(result, Planned):
        todo, version = result.plan, result.version
        data = todo.to_dict()
        data["summary"] = (f"would install {version} for kernel {todo.request.kernel} and activate it"
                           if todo.changes else f"{version} for kernel {todo.request.kernel}: unchanged")
        return data
    data = result.to_dict()
    data["summary"] = (f"{result.version} active for kernel {result.kernel}"
                       + ("" if result.changed else " (already installed)"))
    return data


def step_modules(ctx: Context) -> dict[str, Any]:
    """Load the modules (live systems) and run doctor as the gate for the rest of the bring-up."""
    made: list[str] = []
    loaded = _load(ctx) and not ctx.check
    if loaded:
        made = load_modules(ctx.profile.driver.load_order, root=ctx.root)
    # Offline (--root): no GPU, module or device nodes to look at; the image's driver root and ld cache are.
    checks = None if ctx.live else {"state", "ldcache", "kmod"}
    report = doctor(ctx.root, checks=checks)
    if ctx.check:  # the gate on the node as it is now (before the driver step would have run)
        found = [f"doctor: {c.name}: {c.message}" for c in report.problems()]
        load = "would load the modules; " if _load(ctx) else ""
        gate = f"doctor now: {len(found)} finding(s)" if found else "doctor ok now"
        return {"loaded": False, "device_nodes": [], "doctor": report.to_dict(), "preflight": found,
                "summary": load + gate}
    if not report.ok:
        raise StateError("doctor: " + "; ".join(f"{c.name}: {c.message}" for c in report.problems()),
                         hint="nodeprep doctor shows every check")
    ran = [c.name for c in report.checks if not c.skipped]
    return {"loaded": loaded, "device_nodes": made, "doctor": report.to_dict(),
            "summary": ("modules loaded; " if loaded else "modules not loaded (offline root); ")
            + f"doctor ok ({', '.join(ran)})"}


def step_mig(ctx: Context) -> dict[str, Any]:
    """The profile's MIG layout (mig.config, mig.select) on this host's GPUs through NVML, after the
    driver loaded and before labels, runtime and join; in --check the plan alone. For an image
    (--root other than /) nothing, unless the front-end asks (--mig): its GPUs are the node's, later."""
    mig = ctx.profile.mig
    if mig.config is None:
        return {"changes": False, "summary": "no mig.config in the profile: MIG left as it is"}
    if not (ctx.live if ctx.options.mig is None else ctx.options.mig):
        return {"changes": False, "summary": "offline root: MIG is put in place on the node "
                "(bootstrap there, or nodeprep mig)"}
    return run(ctx.root, mig.config, mig.select, check=ctx.check)


def step_labels(ctx: Context) -> dict[str, Any]:
    """Compute the node's labels (nodeprep.node.labeling.label_node: in --check the driver step would
    activate); write them as an NFD feature file and as JSON for the join."""
    labelled = label_node(ctx.root, LabelNode(
        ProfileLabels.of(ctx.profile), check=ctx.check, activating=ctx.check,
        options={"sysfs_root": ctx.options.sysfs_root, "nvidia_smi_xml": ctx.options.nvidia_smi_xml,
                 "use_nvml": ctx.options.nvml,
                 "kernel": ctx.results.get("driver", {}).get("kernel")}))  # None: the profile's
    result, facts = labelled.result, labelled.facts  # its warnings are in this step's result
    labels = dict(sorted(result.labels.items()))
    warnings = list(result.warnings) + ([labelled.facts_warning] if labelled.facts_warning else [])
    files = [NFD_FEATURES, LABELS_JSON]
    if facts is not None:
        files.append(GPU_FACTS)
    gpu = f"gpu facts: {result.sources.get('gpu', 'none')}"
    if facts is not None and facts.changed:
        gpu += f"; {'would write' if ctx.check else 'wrote'} {GPU_FACTS}"
    if ctx.check:
        return {"labels": labels, "sources": result.sources, "warnings": warnings, "files": files,
                "summary": f"would write {len(labels)} labels ({gpu})"}
    atomic_write(_under(ctx.root, NFD_FEATURES), render_nfd(labels))
    atomic_write(_under(ctx.root, LABELS_JSON), json.dumps(labels, indent=2, sort_keys=True) + "\n")
    return {"labels": labels, "sources": result.sources, "warnings": warnings, "files": files,
            "summary": f"{len(labels)} labels ({gpu})"}


def _joining(ctx: Context) -> dict[str, Any]:
    """What bootstrap adds to the join request: the labels step's labels; doctor already
    gated the bring-up in the modules step (with the checks that fit --root); no discovery in check."""
    labels = ctx.results.get("labels", {}).get("labels")
    return {"nvidia_smi_xml": ctx.options.nvidia_smi_xml, "labels": labels, "skip_preflight": True,
            "check": ctx.check, "discovery": not ctx.check}


def step_runtime(ctx: Context) -> dict[str, Any]:
    """containerd drop-in (nvidia runtime, CDI) and the CDI spec for the active driver root:
    nodeprep.runtime.configure.configure_runtime."""
    outcome = configure_runtime(ctx.root, RuntimeRequest(ctx.profile, check=ctx.check,
                                                         nvidia_smi_xml=ctx.options.nvidia_smi_xml))
    plan, result = outcome.plan, outcome.applied
    if result is None:
        would = [f.target for f in plan.files if f.changed]
        return {"files": [f.summary() for f in plan.files], "warnings": list(plan.warnings),
                "preflight": list(plan.preflight),
                "summary": f"would write {', '.join(would)}" if would else "containerd configuration "
                "unchanged"}
    result["summary"] = (f"wrote {', '.join(result['written'])}" if result["written"]
                         else "containerd configuration unchanged")
    return result


def step_join(ctx: Context) -> dict[str, Any]:
    """Join the cluster (kubeadm/kubelet); with dry-run, or offline, only write the configuration:
    nodeprep.join.joining.join_cluster."""
    if ctx.profile.cluster is None:
        return {"joined": False, "summary": "no cluster section in the profile: not joining"}
    outcome = join_cluster(ctx.root, JoinRequest(ctx.profile, dry_run=ctx.dry_run_join, **_joining(ctx)))
    plan, result = outcome.plan, outcome.result
    if ctx.check:
        would = [f.target for f in plan.files if f.changed]
        runs = [" ".join(a.argv) for a in plan.actions]
        result["summary"] = (f"would write {len(would)} file(s); "
                             + (f"would run {' ; '.join(runs)}" if runs else "would run nothing"))
        return result
    ran = result.get("ran", [])
    deferred = result.get("deferred_commands", [])
    if ran:
        summary = f"joined ({plan.mode}, ran {' ; '.join(' '.join(a) for a in ran)})"
    elif ctx.dry_run_join:
        summary = f"dry run: {plan.mode} configuration written, nothing run; the next bootstrap joins"
    elif deferred:
        summary = f"configuration written; at first boot: {' ; '.join(' '.join(a) for a in deferred)}"
    else:
        summary = "configuration written; " + ("already joined" if plan.already_joined else "nothing to run")
    result["dry_run"] = ctx.dry_run_join
    result["provisional"] = ctx.dry_run_join  # not done: a rerun without the dry run joins
    result["summary"] = summary
    return result


def default_steps() -> list[Step]:
    return [
        Step("driver", "Install and activate the NVIDIA driver", step_driver),
        Step("modules", "Load modules, doctor", step_modules),
        Step("mig", "MIG layout", step_mig),
        Step("labels", "Node labels", step_labels),
        Step("runtime", "Container runtime", step_runtime),
        Step("join", "Join the cluster", step_join),
    ]
