"""The pure core of `nodeprep health`: observations (what NVML and the kernel said, per GPU) in, a
verdict per GPU and one for the node out, and `settle`, the hold that keeps a node from flapping.

Rules (docs/node.md has the table):
- a GPU NVML reports lost (or whose handle/reads fail with GPU_IS_LOST) is unhealthy: reboot;
- an Xid is classed by NVIDIA's catalog (nodeprep.health.catalog); one whose action is not `ignore`
  keeps its GPU unhealthy for `xid_window` seconds after it was seen (the state that outlasts it, ECC
  counters, remaps, a lost GPU, is read again on every pass);
- uncorrected ECC errors since the last reset (volatile total > 0): reset;
- remapped rows pending: reset; a remapping failure: replace (NVIDIA's RMA policy);
- retired pages pending (pre-Ampere): reset (the retirement takes effect at the next reattach);
- NVLink: a link reported inactive while others on the GPU are active: reset (all inactive is a board
  without NVLink, e.g. standalone B200 or PCIe); an error counter (replay, recovery, CRC) rising by
  more than NVLINK_ERROR_RATE per second between two reads: reset (one read alone judges no counter);
- fabric (Hopper+ NVSwitch systems, where NVML supports it): state not COMPLETED or a failed status:
  reset;
- MIG devices carry the verdict of their parent GPU.
A GPU goes unhealthy at once; it is reported healthy again only after it has been healthy for
`hold` seconds without a break, so the node's condition and taint change at most once per hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .catalog import action_of, catalog, worst
from .kmsg import pci_key

FABRIC_COMPLETED = 3  # NVML_GPU_FABRIC_STATE_COMPLETED
FABRIC_STATES = {0: "NOT_SUPPORTED", 1: "NOT_STARTED", 2: "IN_PROGRESS", 3: "COMPLETED"}
MAX_MESSAGE = 1024  # the condition's message, bounded
NVLINK_ERROR_RATE = 1.0  # NVLink DL errors per second (any one counter) that make a GPU unhealthy


@dataclass(frozen=True)
class XidEvent:
    code: int
    at: float  # seconds, the clock `now` is on (CLOCK_MONOTONIC: kmsg's timestamps are on it)
    source: str  # "nvml" or "kmsg"
    text: str = ""
    index: int | None = None  # the GPU, when the source names it by handle (NVML)
    pci: str | None = None  # "dddd:bb:dd", when the source names it by address (kmsg)


@dataclass(frozen=True)
class GpuObservation:
    index: int
    uuid: str
    pci: str  # as NVML spells it, e.g. 00000000:1A:00.0
    lost: str | None = None  # why NVML cannot reach it (None: it answers)
    ecc_uncorrected: int | None = None  # volatile total since the last reset; None: not supported
    remap_pending: bool = False
    remap_failure: bool = False
    retired_pending: bool = False
    nvlink_active: tuple[bool, ...] = ()  # per link that answered
    nvlink_errors: Mapping[str, int] = field(default_factory=dict)
    nvlink_error_rates: Mapping[str, float] = field(default_factory=dict)  # per second, between 2 reads
    fabric_state: int | None = None  # None: not supported
    fabric_status: int | None = None  # the NVML return code of the fabric's probe (0: success)
    mig_children: tuple[str, ...] = ()  # UUIDs of the MIG devices on it

    @property
    def pci_key(self) -> str | None:
        return pci_key(self.pci)


@dataclass(frozen=True)
class Observations:
    gpus: tuple[GpuObservation, ...]
    xids: tuple[XidEvent, ...] = ()
    nvml_error: str | None = None  # NVML did not initialise (no driver, library missing)


@dataclass(frozen=True)
class Finding:
    reason: str  # CamelCase, the condition's reason when it is the worst: XID79, GPULost, ...
    klass: str
    action: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"reason": self.reason, "class": self.klass, "action": self.action, "detail": self.detail}


@dataclass(frozen=True)
class GpuVerdict:
    index: int
    uuid: str
    pci: str
    findings: tuple[Finding, ...]
    mig_children: tuple[str, ...] = ()
    recovering: float | None = None  # healthy now, seconds of the hold still to wait
    observed: Mapping[str, Any] = field(default_factory=dict)  # what was read (counters), for --json

    @property
    def healthy(self) -> bool:
        return not self.blocking

    @property
    def blocking(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.action != "ignore")

    @property
    def action(self) -> str:
        return worst([f.action for f in self.findings])

    def name(self) -> str:
        return f"GPU {self.index} ({self.uuid}, {self.pci})"

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "uuid": self.uuid, "pci": self.pci, "healthy": self.healthy,
                "action": self.action if not self.healthy else "none",
                "findings": [f.to_dict() for f in self.findings],
                "mig_devices": [{"uuid" if u.startswith("MIG-") else "name": u, "healthy": self.healthy,
                                 "parent": self.uuid} for u in self.mig_children],
                "observed": dict(self.observed),
                **({"recovering_s": round(self.recovering, 1)} if self.recovering is not None else {})}


@dataclass(frozen=True)
class NodeVerdict:
    healthy: bool
    reason: str
    message: str
    action: str
    gpus: tuple[GpuVerdict, ...]
    orphans: tuple[XidEvent, ...] = ()  # Xids naming a PCI address no GPU NVML lists has

    @property
    def status(self) -> str:
        return "True" if self.healthy else "False"

    def to_dict(self) -> dict[str, Any]:
        return {"healthy": self.healthy, "condition": {"type": "GPUHealthy", "status": self.status,
                                                       "reason": self.reason, "message": self.message},
                "taint": not self.healthy, "action": self.action if not self.healthy else "none",
                "gpus": [g.to_dict() for g in self.gpus]}


def _xid_gpu(event: XidEvent, gpus: tuple[GpuObservation, ...]) -> GpuObservation | None:
    for g in gpus:
        if event.index is not None and event.index == g.index:
            return g
        if event.pci is not None and event.pci == g.pci_key:
            return g
    return None


def _findings(g: GpuObservation, xids: list[XidEvent]) -> list[Finding]:
    out: list[Finding] = []
    if g.lost:
        out.append(Finding("GPULost", "bus", "reboot", f"NVML cannot reach the GPU ({g.lost})"))
    seen: set[int] = set()
    for x in sorted(xids, key=lambda x: -x.at):
        if x.code in seen:
            continue
        seen.add(x.code)
        row = catalog().lookup(x.code)
        action = action_of(x.code, x.text)
        detail = f"Xid {x.code} {row.description} ({row.mnemonic}, from {x.source})"
        if x.text:
            detail += f": {x.text}"
        out.append(Finding(f"XID{x.code}", row.klass, action, detail))
    if g.ecc_uncorrected:
        out.append(Finding("ECCUncorrected", "memory", "reset",
                           f"{g.ecc_uncorrected} uncorrected ECC errors since the last reset"))
    if g.remap_failure:
        out.append(Finding("RowRemapFailure", "memory", "replace", "row remapping failed (RMA policy)"))
    if g.remap_pending:
        out.append(Finding("RowRemapPending", "memory", "reset", "remapped rows pending a GPU reset"))
    if g.retired_pending:
        out.append(Finding("RetiredPagesPending", "memory", "reset", "retired pages pending a reset"))
    links = g.nvlink_active
    if any(links) and not all(links):
        down = [str(i) for i, up in enumerate(links) if not up]
        out.append(Finding("NVLinkDown", "nvlink", "reset", f"NVLink links {','.join(down)} inactive, "
                           f"{sum(links)} of {len(links)} active"))
    rising = {k: v for k, v in g.nvlink_error_rates.items() if v > NVLINK_ERROR_RATE}
    if rising:
        rates = ", ".join(f"{k} {v:.0f}/s" for k, v in sorted(rising.items()))
        out.append(Finding("NVLinkErrors", "nvlink", "reset", f"NVLink error counters rising ({rates})"))
    if g.fabric_state is not None and g.fabric_state != 0:
        if g.fabric_state != FABRIC_COMPLETED:
            out.append(Finding("FabricNotReady", "fabric", "reset", "fabric state "
                               f"{FABRIC_STATES.get(g.fabric_state, g.fabric_state)}, not COMPLETED"))
        elif g.fabric_status not in (None, 0):
            out.append(Finding("FabricError", "fabric", "reset", f"fabric status {g.fabric_status}"))
    return out


def _observed(g: GpuObservation) -> dict[str, Any]:
    if g.lost:
        return {"lost": g.lost}
    return {"ecc_uncorrected_volatile": g.ecc_uncorrected, "remapped_rows_pending": g.remap_pending,
            "remapped_rows_failure": g.remap_failure, "retired_pages_pending": g.retired_pending,
            "nvlink_active": f"{sum(g.nvlink_active)}/{len(g.nvlink_active)}",
            "nvlink_errors": dict(g.nvlink_errors),
            "nvlink_error_rates": {k: round(v, 1) for k, v in g.nvlink_error_rates.items()},
            "fabric_state": None if g.fabric_state is None
            else FABRIC_STATES.get(g.fabric_state, g.fabric_state)}


def with_rates(previous: Observations | None, obs: Observations, seconds: float) -> Observations:
    """`obs` with each GPU's NVLink error counters' rise per second since `previous` (read `seconds`
    before; the same GPU by UUID). A counter that went down (reset, reread from zero) rose by 0."""
    if previous is None or seconds <= 0:
        return obs
    before = {g.uuid: g for g in previous.gpus if not g.lost}
    gpus = []
    for g in obs.gpus:
        p = before.get(g.uuid)
        if p is None or g.lost:
            gpus.append(g)
            continue
        rates = {k: max(0, v - p.nvlink_errors.get(k, v)) / seconds for k, v in g.nvlink_errors.items()}
        gpus.append(replace(g, nvlink_error_rates=rates))
    return replace(obs, gpus=tuple(gpus))


def evaluate(obs: Observations, now: float, *, xid_window: float) -> NodeVerdict:
    """The verdict of one pass over `obs` at `now` (no hold: see `settle`)."""
    if obs.nvml_error is not None:
        return NodeVerdict(False, "NVMLUnavailable", f"NVML unavailable: {obs.nvml_error}"[:MAX_MESSAGE],
                           "reboot", ())
    recent = [x for x in obs.xids if now - x.at <= xid_window]
    per_gpu: dict[int, list[XidEvent]] = {}
    orphans: list[XidEvent] = []
    for x in recent:
        g = _xid_gpu(x, obs.gpus)
        if g is None:
            orphans.append(x)
        else:
            per_gpu.setdefault(g.index, []).append(x)
    gpus = tuple(GpuVerdict(g.index, g.uuid, g.pci, tuple(_findings(g, per_gpu.get(g.index, []))),
                            g.mig_children, observed=_observed(g))
                 for g in sorted(obs.gpus, key=lambda g: g.index))
    return node_verdict(gpus, orphans)


def node_verdict(gpus: tuple[GpuVerdict, ...], orphans: list[XidEvent] | None = None) -> NodeVerdict:
    """The node's verdict over its GPUs' verdicts: unhealthy when any GPU is, the reason that of the
    worst finding of the first unhealthy GPU, the message naming every unhealthy GPU."""
    bad = [g for g in gpus if not g.healthy]
    notes = [f"Xid {x.code} on {x.pci} (no GPU NVML lists there)" for x in orphans or []
             if action_of(x.code, x.text) != "ignore"]
    if not bad and not notes:
        recovering = [g for g in gpus if g.recovering is not None]
        message = f"all {len(gpus)} GPUs healthy" if gpus else "no GPUs"
        if recovering:
            message += "; " + ", ".join(f"GPU {g.index} healthy again, in its hold" for g in recovering)
        return NodeVerdict(True, "GPUsHealthy", message, "none", gpus, tuple(orphans or ()))
    parts = []
    for g in bad:
        findings = "; ".join(f"{f.detail}: {f.action}" for f in g.blocking)
        children = f" (with its MIG devices {', '.join(g.mig_children)})" if g.mig_children else ""
        parts.append(f"{g.name()}{children}: {findings}")
    parts += notes
    first = bad[0].blocking if bad else ()
    order = ("replace", "reboot", "reset")
    reason = (min(first, key=lambda f: order.index(f.action)).reason if first
              else f"XID{orphans[0].code}" if orphans else "GPUUnhealthy")
    action = worst([g.action for g in bad] + (["reset"] if notes else []))
    return NodeVerdict(False, reason, "; ".join(parts)[:MAX_MESSAGE], action, gpus, tuple(orphans or ()))


@dataclass(frozen=True)
class Held:
    """What `settle` remembers per GPU (by UUID): its last unhealthy verdict and since when (on the
    `now` clock) it has been healthy again; and the same for the node when no GPU could be judged
    (NVML unavailable)."""

    last_bad: Mapping[str, GpuVerdict] = field(default_factory=dict)
    healthy_since: Mapping[str, float] = field(default_factory=dict)
    node_bad: NodeVerdict | None = None
    node_since: float | None = None


def settle(held: Held, verdict: NodeVerdict, now: float, *, hold: float) -> tuple[Held, NodeVerdict]:
    """The verdict to report: a GPU that was unhealthy stays reported unhealthy (with its last
    findings) until it has been healthy for `hold` seconds without a break; so does the node after a
    verdict without GPUs (NVML unavailable)."""
    if not verdict.gpus:
        if not verdict.healthy:
            return replace(held, node_bad=verdict, node_since=None), verdict
        return held, verdict
    if held.node_bad is not None:
        start = held.node_since if held.node_since is not None else now
        if now - start < hold:
            return replace(held, node_since=start), held.node_bad
        held = replace(held, node_bad=None, node_since=None)
    last_bad = dict(held.last_bad)
    since = dict(held.healthy_since)
    out = []
    for g in verdict.gpus:
        if not g.healthy:
            last_bad[g.uuid] = g
            since.pop(g.uuid, None)
            out.append(g)
            continue
        if g.uuid not in last_bad:
            out.append(g)
            continue
        start = since.setdefault(g.uuid, now)
        if now - start >= hold:
            del last_bad[g.uuid]
            del since[g.uuid]
            out.append(g)
        else:
            prev = last_bad[g.uuid]
            out.append(replace(prev, recovering=hold - (now - start)))
    if out == list(verdict.gpus):
        return Held(last_bad, since), verdict
    return Held(last_bad, since), node_verdict(tuple(out), list(verdict.orphans))
