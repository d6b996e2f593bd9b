"""Facts -> labels. `node_labels(options)` is the library entry point used by the CLI, join and
bootstrap; it only reads (files, NVML, nvidia-smi, metadata services) and never raises for a missing
or slow fact source: it records a warning and uses the next source instead. It returns the warnings
and does not log them: each front-end prints them once."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ..errors import InputError
from ..profile.fields import field_error
from ..urls import redact_url
from . import cloud as cloudmod
from . import gpu as gpumod
from . import vgpu as vgpumod
from .system import SystemFacts, system_facts
from .validate import VALUE_MAX, check_labels, sanitise, split_for_kubelet, validate_label

log = logging.getLogger(__name__)

PREFIX = "nodeprep.dev"  # labels nodeprep owns
# Set by `nodeprep verify-gpus` (the GPU self-test's verdict), never by `labels --apply`.
VERIFIED_LABEL = f"{PREFIX}/gpu-verified"
NVIDIA = "nvidia.com"
MIG_STRATEGIES = ("none", "single", "mixed")
T = TypeVar("T")


@dataclass(frozen=True)
class LabelOptions:
    root: Path = Path("/")
    sysfs_root: Path = Path("/sys")
    driver_sysfs: Path | None = None  # whether the driver is loaded (NVML, nvidia-smi); None: sysfs_root
    dmi_root: Path | None = None  # default: <sysfs_root>/class/dmi/id
    nvidia_smi_xml: Path | None = None  # read GPU facts from this capture instead of asking the driver
    cloud: str = "auto"  # auto | aws | gce | azure | none
    endpoints: cloudmod.Endpoints = field(default_factory=cloudmod.Endpoints.from_env)
    extra: Mapping[str, str] = field(default_factory=dict)
    mig_strategy: str = "none"
    pci_ids: Path | None = None
    kernel: str | None = None  # default: the running kernel; under a --root: the root's (system.root_kernel)
    use_nvml: bool = True
    run_nvidia_smi: bool = True
    source_timeout: float = 1.0  # seconds, per fact source
    total_timeout: float = 1.5  # seconds, all fact gathering

    @property
    def dmi_dir(self) -> Path:
        return self.dmi_root if self.dmi_root is not None else self.sysfs_root / "class" / "dmi" / "id"


@dataclass(frozen=True)
class Facts:
    gpu: gpumod.GpuFacts | None
    cloud: cloudmod.CloudFacts
    dmi: dict[str, str]
    system: SystemFacts
    vgpu: vgpumod.VgpuFacts | None = None  # None: not readable in full, GFD sets no vGPU label

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LabelResult:
    labels: dict[str, str]
    facts: Facts
    sources: dict[str, str]
    warnings: list[str]

    def split(self) -> tuple[dict[str, str], dict[str, str]]:
        """(self-settable by the kubelet, needs an API write)."""
        return split_for_kubelet(self.labels)

    def to_dict(self) -> dict[str, Any]:
        return {"labels": dict(sorted(self.labels.items())), "sources": self.sources,
                "warnings": self.warnings, "facts": self.facts.to_dict()}


def label_value(text: str | None) -> str | None:
    """A fact as a valid label value: GFD's sanitise, cut to 63 characters, alphanumeric at both ends."""
    if not text:
        return None
    value = sanitise(text)[:VALUE_MAX].strip("-_.")
    return value or None


def _bounded(fn: Callable[[], T], seconds: float) -> tuple[bool, T | None, BaseException | None]:
    """Run fn in a daemon thread for at most `seconds`: (finished, result, error)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - reported to the caller
            box["error"] = e

    t = threading.Thread(target=target, daemon=True, name="nodeprep-facts")
    t.start()
    t.join(max(seconds, 0.0))
    if t.is_alive():
        return False, None, None
    return True, box.get("result"), box.get("error")


# --- fact gathering --------------------------------------------------------------------------------

def _gpu_chain(opts: LabelOptions, deadline: float, warnings: list[str]) -> gpumod.GpuFacts | None:
    if opts.nvidia_smi_xml is not None:
        try:
            return gpumod.from_nvidia_smi_file(opts.nvidia_smi_xml, opts.sysfs_root, opts.pci_ids)
        except (OSError, ValueError) as e:
            raise InputError(f"{opts.nvidia_smi_xml}: {e}") from None
    readers: list[tuple[str, Callable[[float], gpumod.GpuFacts]]] = []
    if opts.use_nvml:
        readers.append(("nvml", lambda t: gpumod.from_nvml(opts.sysfs_root, opts.driver_sysfs)))
    if opts.run_nvidia_smi:
        readers.append(("nvidia-smi", lambda t: gpumod.from_nvidia_smi(
            opts.root, opts.sysfs_root, t, opts.pci_ids, opts.driver_sysfs)))
    for name, reader in readers:
        budget = min(opts.source_timeout, deadline - time.monotonic())
        if budget <= 0:
            warnings.append(f"gpu: time budget spent, {name} not asked")
            continue
        done, facts, error = _bounded(functools.partial(reader, budget), budget)
        if not done:
            warnings.append(f"gpu: {name} did not answer within {budget:.2g}s")
        elif isinstance(error, gpumod.GpuSourceUnavailable):
            log.debug("gpu: %s unavailable: %s", name, error)
            if len(readers) == 1:  # the one source asked for (labels --source): say why it said nothing
                warnings.append(f"gpu: {name} unavailable: {error}")
        elif error is not None:
            warnings.append(f"gpu: {name} failed: {error}")
        elif facts is not None:
            return facts
    try:
        return gpumod.from_sysfs(opts.sysfs_root, opts.pci_ids)
    except gpumod.GpuSourceUnavailable as e:
        warnings.append(f"gpu: no source available ({e})")
    return None


def gpu_facts(opts: LabelOptions, warnings: list[str]) -> gpumod.GpuFacts | None:
    """The GPU facts alone, from the labels' chain, within opts.total_timeout (node.gpufacts)."""
    return _gpu_chain(opts, time.monotonic() + opts.total_timeout, warnings)


def _cloud_facts(opts: LabelOptions, dmi: dict[str, str], deadline: float,
                 warnings: list[str]) -> cloudmod.CloudFacts:
    if opts.cloud not in cloudmod.CLOUD_CHOICES:
        raise field_error("labels.cloud",
                          f"{opts.cloud!r}: expected one of {', '.join(cloudmod.CLOUD_CHOICES)}")
    detected = cloudmod.detect_cloud(dmi)
    cloud = detected if opts.cloud == "auto" else (None if opts.cloud == "none" else opts.cloud)
    if cloud is not None:
        # One deadline for every metadata request together (connect, send, each read): the client
        # enforces it itself, the worker thread is only a second guard.
        budget = max(min(opts.source_timeout, deadline - time.monotonic()), 0.0)
        cloud_deadline = time.monotonic() + budget
        done, facts, error = _bounded(
            lambda: cloudmod.query_metadata(cloud, opts.endpoints, cloud_deadline), budget + 0.25)
        if done and error is None and facts is not None:
            return facts
        if not done or isinstance(error, TimeoutError):
            why = f"no complete answer within the {budget:.2g}s budget"
        elif isinstance(error, cloudmod.ResponseTooLarge):
            why = f"{error}; refused"
        elif isinstance(error, ConnectionError):
            why = "connection failed"
        else:
            why = f"{type(error).__name__}: {error}"
        warnings.append(f"cloud: {cloud} metadata at {redact_url(opts.endpoints.for_cloud(cloud))} failed "
                        f"({why}); falling back to DMI")
    # DMI fallback: product_name is the instance type on AWS Nitro and a useful model on bare metal,
    # but not the machine type on GCE or Azure ("Google Compute Engine", "Virtual Machine").
    if cloud in (None, "aws"):
        itype = cloudmod.dmi_instance_type(dmi)
        if itype:
            return cloudmod.CloudFacts(cloud, itype, source="dmi")
    return cloudmod.CloudFacts(cloud)


def gather_facts(opts: LabelOptions) -> tuple[Facts, list[str]]:
    """All facts, within opts.total_timeout (GPU and cloud sources run side by side)."""
    warnings: list[str] = []
    start = time.monotonic()
    deadline = start + opts.total_timeout
    dmi_problems: list[str] = []
    dmi = cloudmod.read_dmi(opts.dmi_dir, dmi_problems)
    warnings.extend(f"dmi: {p}" for p in dmi_problems)
    host_problems: list[str] = []
    system = system_facts(opts.root, opts.kernel, host_problems)
    warnings.extend(f"host: {p}" for p in host_problems)
    cloud_warnings: list[str] = []
    box: dict[str, Any] = {}

    def cloud_job() -> None:
        try:
            box["cloud"] = _cloud_facts(opts, dmi, deadline, cloud_warnings)
        except BaseException as e:  # noqa: BLE001
            box["error"] = e

    t = threading.Thread(target=cloud_job, daemon=True, name="nodeprep-cloud")
    t.start()
    gpu = _gpu_chain(opts, deadline, warnings)
    t.join(max(deadline - time.monotonic(), 0) + 0.1)
    if "error" in box:
        raise box["error"]
    warnings.extend(cloud_warnings)
    cloud = box.get("cloud")
    if cloud is None:
        warnings.append("cloud: facts not ready within the time budget; falling back to DMI")
        itype = cloudmod.dmi_instance_type(dmi)
        cloud = cloudmod.CloudFacts(cloudmod.detect_cloud(dmi), itype, source="dmi" if itype else "none")
    if gpu is not None:
        warnings.extend(f"gpu: {n}" for n in gpu.notes)
    vgpu_problems: list[str] = []
    vgpu = vgpumod.read_vgpu(opts.sysfs_root, vgpu_problems) if gpu is not None and gpu.gpus else None
    warnings.extend(f"vgpu: {p}" for p in vgpu_problems)
    return Facts(gpu, cloud, dmi, system, vgpu), warnings


# --- labels ----------------------------------------------------------------------------------------

def _gpu_mode(gpus: tuple[gpumod.Gpu, ...]) -> str:
    classes = {g.pci_class for g in gpus}
    if len(classes) != 1:
        return "unknown"
    modes: dict[int | None, str] = {gpumod.PCI_CLASS_VGA: "graphics", gpumod.PCI_CLASS_3D: "compute"}
    return modes.get(classes.pop(), "unknown")


def _version_labels(driver: str | None, cuda: tuple[int, int] | None, warnings: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    if driver:
        parts = driver.split(".")
        if 2 <= len(parts) <= 3:
            rev = parts[2] if len(parts) == 3 else ""
            for old, new, value in (("major", "major", parts[0]), ("minor", "minor", parts[1]),
                                    ("rev", "revision", rev)):
                out[f"{NVIDIA}/cuda.driver.{old}"] = value
                out[f"{NVIDIA}/cuda.driver-version.{new}"] = value
            out[f"{NVIDIA}/cuda.driver-version.full"] = driver
        else:
            warnings.append(f"gpu: driver version {driver!r} does not match X.Y[.Z]")
    if cuda:
        out[f"{NVIDIA}/cuda.runtime.major"] = out[f"{NVIDIA}/cuda.runtime-version.major"] = str(cuda[0])
        out[f"{NVIDIA}/cuda.runtime.minor"] = out[f"{NVIDIA}/cuda.runtime-version.minor"] = str(cuda[1])
        out[f"{NVIDIA}/cuda.runtime-version.full"] = f"{cuda[0]}.{cuda[1]}"
    return out


def _vgpu_labels(vgpu: vgpumod.VgpuFacts | None) -> dict[str, str]:
    """GFD's vGPU labeler (internal/lm/vgpu.go): present true/false, the host driver when known."""
    if vgpu is None:
        return {}
    out = {f"{NVIDIA}/vgpu.present": "true" if vgpu.present else "false"}
    if vgpu.host_driver_version is not None:
        out[f"{NVIDIA}/vgpu.host-driver-version"] = vgpu.host_driver_version
        out[f"{NVIDIA}/vgpu.host-driver-branch"] = vgpu.host_driver_branch or ""
    return out


def clique_labels(gpus: tuple[gpumod.Gpu, ...], warnings: list[str]) -> dict[str, str]:
    """GFD's IMEX labeler (internal/lm/imex.go, v0.20.0): `nvidia.com/gpu.clique` =
    `<cluster UUID>.<clique id>` of the GPUs attached to an NVLink fabric (registration completed,
    status success, non-zero cluster UUID; the others are left out), set only when all of them agree
    on both; none when no GPU is attached. Where NVML fails to say (not "not supported"), GFD stops
    labelling altogether; nodeprep sets no clique label and says why (pure)."""
    failed = [(i, g.fabric_error) for i, g in enumerate(gpus) if g.fabric_error]
    if failed:
        warnings.append(f"gpu: GPU {failed[0][0]}: {failed[0][1]}; {NVIDIA}/gpu.clique not set")
        return {}
    waiting = [(i, g.fabric) for i, g in enumerate(gpus)
               if g.fabric is not None and g.fabric.state != gpumod.FABRIC_COMPLETED and g.fabric.state != 0]
    if waiting:
        states = sorted({gpumod.FABRIC_STATES.get(f.state, str(f.state)) for _, f in waiting})
        warnings.append(f"gpu: NVLink fabric not complete on GPU {', '.join(str(i) for i, _ in waiting)} "
                        f"({', '.join(states)}): left out of {NVIDIA}/gpu.clique")
    attached = [(i, g.fabric) for i, g in enumerate(gpus) if g.fabric is not None and g.fabric.attached]
    clusters = {f.cluster_uuid for _, f in attached}
    cliques = {f.clique_id for _, f in attached}
    if len(clusters) > 1 or len(cliques) > 1:
        ids = ", ".join(str(c) for c in sorted(cliques))
        warnings.append(f"gpu: the GPUs' fabric IDs differ (cluster UUIDs {', '.join(sorted(clusters))}; "
                        f"clique ids {ids}): {NVIDIA}/gpu.clique not set")
        return {}
    if not attached:
        return {}
    return {f"{NVIDIA}/gpu.clique": f"{clusters.pop()}.{cliques.pop()}"}


def _mig_attr_labels(prefix: str, mig: gpumod.MigDevice) -> dict[str, str]:
    out = {f"{prefix}.{k}": str(v) for k, v in mig.attributes.items()}
    if mig.memory_mib:
        out[f"{prefix}.memory"] = str(mig.memory_mib)
    return out


def gpu_labels(facts: Facts, mig_strategy: str, warnings: list[str]) -> dict[str, str]:
    """GFD's labels for these GPU facts (GFD sets none when there is no GPU)."""
    g = facts.gpu
    if g is None or not g.gpus:
        return {}
    counts = Counter(x.name for x in g.gpus)
    if len(counts) > 1:
        warnings.append("gpu: several GPU models (" + ", ".join(sorted(counts)) +
                        "); labels describe the most common one")
    name = counts.most_common(1)[0][0]
    dev = next(x for x in g.gpus if x.name == name)
    product = sanitise(name)
    labels = {
        f"{NVIDIA}/gpu.present": "true",
        f"{NVIDIA}/gpu.machine": label_value(facts.dmi.get("product_name")) or "unknown",
        f"{NVIDIA}/gpu.product": product,
        f"{NVIDIA}/gpu.count": str(counts[name]),
        f"{NVIDIA}/gpu.replicas": "0" if dev.mig_enabled else "1",
        f"{NVIDIA}/gpu.sharing-strategy": "none",
        f"{NVIDIA}/gpu.mode": _gpu_mode(g.gpus),
        f"{NVIDIA}/mps.capable": "false",
    }
    if dev.memory_mib:
        labels[f"{NVIDIA}/gpu.memory"] = str(dev.memory_mib)
    if dev.family:
        labels[f"{NVIDIA}/gpu.family"] = dev.family
    if dev.compute:
        labels[f"{NVIDIA}/gpu.compute.major"] = str(dev.compute[0])
        labels[f"{NVIDIA}/gpu.compute.minor"] = str(dev.compute[1])
    capable = [x.mig_capable for x in g.gpus if x.mig_capable is not None]
    if capable:
        labels[f"{NVIDIA}/mig.capable"] = "true" if any(capable) else "false"
    labels.update(_version_labels(g.driver_version, g.cuda_version, warnings))
    labels.update(clique_labels(g.gpus, warnings))
    labels.update(_vgpu_labels(facts.vgpu))
    if mig_strategy not in MIG_STRATEGIES:
        raise InputError(f"--mig-strategy {mig_strategy!r}: expected one of {', '.join(MIG_STRATEGIES)}")
    if mig_strategy != "none":
        labels[f"{NVIDIA}/mig.strategy"] = mig_strategy
        labels.update(_mig_labels(g.gpus, name, mig_strategy, warnings))
    if facts.system.mig_config is not None:  # mig-manager's labels, for the layout `nodeprep mig` applied
        labels[f"{NVIDIA}/mig.config"] = facts.system.mig_config
        labels[f"{NVIDIA}/mig.config.state"] = facts.system.mig_config_state or ""
    return labels


def _mig_labels(gpus: tuple[gpumod.Gpu, ...], model: str, strategy: str,
                warnings: list[str]) -> dict[str, str]:
    migs = [m for x in gpus if x.mig_enabled for m in x.mig_devices]
    if not any(x.mig_enabled for x in gpus):
        return {}
    if any(m.profile is None for m in migs):
        warnings.append(f"gpu: MIG profile names unknown from this source; mig-strategy={strategy} "
                        "labels need NVML")
        return {}
    out: dict[str, str] = {}
    profiles = Counter((m.profile or "").replace("+", ".") for m in migs)  # GFD: 1g.10gb+me -> 1g.10gb.me
    if strategy == "single":
        if len(profiles) != 1 or any(not x.mig_enabled or not x.mig_devices for x in gpus):
            return {f"{NVIDIA}/gpu.product": f"{sanitise(model)}-MIG-INVALID", f"{NVIDIA}/gpu.count": "0",
                    f"{NVIDIA}/gpu.replicas": "0", f"{NVIDIA}/gpu.sharing-strategy": "",
                    f"{NVIDIA}/gpu.memory": "0"}
        profile = next(iter(profiles))
        out[f"{NVIDIA}/gpu.product"] = f"{sanitise(model)}-MIG-{sanitise(profile)}"
        out[f"{NVIDIA}/gpu.count"] = str(len(migs))
        out[f"{NVIDIA}/gpu.replicas"] = "1"
        out.update(_mig_attr_labels(f"{NVIDIA}/gpu", migs[0]))
        return out
    for profile, count in profiles.items():
        prefix = f"{NVIDIA}/mig-{profile}"
        mig = next(m for m in migs if (m.profile or "").replace("+", ".") == profile)
        out[f"{prefix}.product"] = f"{sanitise(model)}-MIG-{sanitise(profile)}"
        out[f"{prefix}.count"] = str(count)
        out[f"{prefix}.replicas"] = "1"
        out[f"{prefix}.sharing-strategy"] = "none"
        out.update(_mig_attr_labels(prefix, mig))
    return out


def host_labels(facts: Facts) -> dict[str, str]:
    """Instance type, topology, and nodeprep's own labels."""
    out: dict[str, str] = {}
    c = facts.cloud
    for key, value in (("node.kubernetes.io/instance-type", c.instance_type),
                       ("topology.kubernetes.io/region", c.region),
                       ("topology.kubernetes.io/zone", c.zone),
                       (f"{PREFIX}/cloud", c.cloud),
                       (f"{PREFIX}/os", f"{facts.system.os_id}-{facts.system.os_version}"
                        if facts.system.os_id and facts.system.os_version else facts.system.os_id),
                       (f"{PREFIX}/kernel", kernel_value(facts.system.kernel)),
                       (f"{PREFIX}/driver-version", facts.system.driver_version),
                       (f"{PREFIX}/driver-flavour", facts.system.flavour),
                       (f"{PREFIX}/artifact-digest", _short_digest(facts.system.artifact_digest)),
                       (f"{PREFIX}/artifact-kernel", kernel_value(facts.system.artifact_kernel)),
                       (f"{PREFIX}/artifact-os", facts.system.artifact_os),
                       (f"{PREFIX}/gpu-source", facts.gpu.source if facts.gpu and facts.gpu.gpus else None)):
        v = label_value(value)
        if v:
            out[key] = v
    return out


def kernel_value(release: str | None) -> str | None:
    """A kernel release as a label value: '+' (Debian 13's and the backports kernels' 6.12.94+deb13-amd64)
    is not allowed there and becomes '_' (6.12.94_deb13-amd64), so the name stays readable."""
    return release.replace("+", "_") if release else release


def _short_digest(digest: str | None) -> str | None:
    """'sha256:<64 hex>' -> first 32 hex digits (a label value holds at most 63 characters)."""
    if not digest:
        return None
    return digest.split(":", 1)[-1][:32]


def build_labels(facts: Facts, *, extra: Mapping[str, str] | None = None, mig_strategy: str = "none",
                 warnings: list[str] | None = None) -> dict[str, str]:
    """Pure: facts (+ user extras, which win) -> validated labels. Invalid derived labels are dropped
    with a warning; invalid user labels raise InputError."""
    warnings = warnings if warnings is not None else []
    extra = dict(extra or {})
    check_labels(extra, source="label")
    labels = {**host_labels(facts), **gpu_labels(facts, mig_strategy, warnings)}
    for key in list(labels):
        problems = validate_label(key, labels[key])
        if problems:
            warnings.append(f"dropped derived label: {'; '.join(problems)}")
            del labels[key]
    labels.update(extra)
    return dict(sorted(labels.items()))


def node_labels(options: LabelOptions | None = None) -> LabelResult:
    """Gather facts (bounded in time) and compute this node's labels."""
    opts = options or LabelOptions()
    check_labels(dict(opts.extra), source="label")
    facts, warnings = gather_facts(opts)
    labels = build_labels(facts, extra=opts.extra, mig_strategy=opts.mig_strategy, warnings=warnings)
    sources = {
        "gpu": facts.gpu.source if facts.gpu else "none",
        "cloud": facts.cloud.source,
        "dmi": str(opts.dmi_dir) if facts.dmi else "none",
    }
    return LabelResult(labels, facts, sources, warnings)  # the front-end reports the warnings, once
