"""The MIG layout plan (pure): from what NVML says of each GPU (MIG mode now and pending, the MIG
profiles it offers, the MIG devices it has) and one mig-config of the profile's `mig.config`
(mig-parted's format, nodeprep.profile.migparted) to what must change: MIG mode to enable or
disable, MIG devices (a GPU instance with its compute instance) to destroy and to create. A GPU whose
layout is in place has nothing to do, so planning twice plans nothing the second time.

As mig-parted does, a GPU whose MIG devices differ from the wanted ones loses all of them and gets
the wanted set, created the largest first; MIG devices are never changed one by one. A plan with a
problem (a GPU index the node lacks, a profile the GPU does not offer) is refused as a whole."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..profile.migparted import PROFILE_RE, MigEntry, entries

# mig-manager's nvidia.com/mig.config.state values nodeprep uses
STATE_SUCCESS, STATE_PENDING, STATE_FAILED = "success", "pending", "failed"


@dataclass(frozen=True)
class GpuMig:
    """One GPU as NVML sees it."""

    index: int
    uuid: str
    name: str
    pci_id: str  # "0x233010DE": NVML's pciDeviceId, as mig-parted's device-filter names it
    capable: bool  # NVML answers nvmlDeviceGetMigMode
    current: bool  # MIG mode in effect
    pending: bool  # MIG mode after the next GPU reset
    profiles: tuple[str, ...] = ()  # GPU instance profiles it offers ("1g.10gb", "1g.10gb+me", ...)
    devices: tuple[str, ...] = ()  # its MIG devices now, by profile ("1g.10gb", "1c.2g.20gb", ...)


@dataclass(frozen=True)
class GpuPlan:
    index: int
    name: str
    uuid: str
    mig_enabled: bool  # wanted
    mode: str | None = None  # "enable" | "disable": MIG mode to set
    reset_pending: bool = False  # the wanted mode is set but takes effect at the next GPU reset
    destroy: tuple[str, ...] = ()  # MIG devices to destroy (all it has)
    create: tuple[str, ...] = ()  # MIG devices to create, in this order

    @property
    def changes(self) -> bool:
        return bool(self.mode or self.destroy or self.create)

    def line(self) -> str:
        """What changes on this GPU, in order (one line)."""
        steps = []
        if self.destroy:
            steps.append(f"destroy {_counted(self.destroy)}")
        if self.mode:
            steps.append(f"{self.mode} MIG mode")
        if self.create:
            steps.append(f"create {_counted(self.create)}")
        if self.reset_pending:
            steps.append("(MIG mode takes effect at the next GPU reset)")
        return f"GPU {self.index} ({self.name}): " + ", then ".join(steps)


@dataclass(frozen=True)
class MigPlan:
    config: str
    gpus: tuple[GpuPlan, ...]
    untouched: tuple[int, ...] = ()  # GPUs no entry of the config names: left as they are
    problems: tuple[str, ...] = ()
    in_place: tuple[tuple[int, tuple[str, ...]], ...] = ()  # GPU -> its wanted MIG devices, in place

    @property
    def changes(self) -> bool:
        return any(g.changes for g in self.gpus)

    def lines(self) -> list[str]:
        wanted = dict(self.in_place)
        out = []
        for g in self.gpus:
            if g.changes:
                out.append(g.line())
            else:
                have = wanted.get(g.index, ())
                tail = " (takes effect at the next GPU reset)" if g.reset_pending else ""
                out.append(f"GPU {g.index} ({g.name}): in place: MIG "
                           f"{'enabled' if g.mig_enabled else 'disabled'}"
                           f"{', ' + _counted(have) if have else ''}{tail}")
        if self.untouched:
            gpus = ", ".join(map(str, self.untouched))
            out.append(f"GPU {gpus}: not named by {self.config}; left as they are")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config, "changes": self.changes, "problems": list(self.problems),
                "untouched": list(self.untouched),
                "gpus": [{**asdict(g), "changes": g.changes} for g in self.gpus],
                "plan": self.lines()}


def _counted(names: Sequence[str]) -> str:
    counts = Counter(names)
    return ", ".join(f"{n}x {p}" for p, n in counts.items())


def gi_part(profile: str) -> str:
    """The GPU instance profile of a MIG device profile: '1c.2g.20gb' -> '2g.20gb', '2c.2g.20gb' ->
    '2g.20gb', '1g.10gb+me' -> '1g.10gb+me' (pure)."""
    m = PROFILE_RE.fullmatch(profile)
    if not m or not m.group("c"):
        return profile
    return profile.split(".", 1)[1]


def canonical(profile: str) -> str:
    """'2c.2g.20gb' -> '2g.20gb' (a compute instance the size of its GPU instance is the plain name)."""
    m = PROFILE_RE.fullmatch(profile)
    if m and m.group("c") and m.group("c") == m.group("g"):
        return gi_part(profile)
    return profile


def creation_order(wanted: Sequence[tuple[str, int]]) -> tuple[str, ...]:
    """mig-parted's Flatten order: the most GPU slices first, then the most compute slices, then by
    attributes, so large instances find room before small ones fragment the GPU."""
    def key(p: str) -> tuple[int, int, str]:
        m = PROFILE_RE.fullmatch(p)
        assert m, p
        g = int(m.group("g"))
        return (-g, -int(m.group("c") or g), m.group("attrs") or "")

    flat = [canonical(p) for p, n in wanted for _ in range(n)]
    return tuple(sorted(flat, key=key))


def _selected(gpus: Sequence[GpuMig], entry: MigEntry) -> list[GpuMig]:
    return [g for g in gpus if (entry.devices is None or g.index in entry.devices)
            and (not entry.device_filter or "0x" + g.pci_id[2:].upper() in entry.device_filter)]


def plan(gpus: Sequence[GpuMig], spec: dict[str, Any], select: str | None) -> MigPlan:
    """The plan that puts config `select` (None: the spec's only one) of `spec` on `gpus`."""
    names = list(spec["mig-configs"])
    name = select if select is not None else names[0]
    problems: list[str] = []
    taken: dict[int, int] = {}
    out: list[GpuPlan] = []
    in_place: list[tuple[int, tuple[str, ...]]] = []
    present = {g.index for g in gpus}
    for i, entry in enumerate(entries(spec, name)):
        where = f"mig.config: mig-configs.{name}[{i}]"
        missing = [d for d in (entry.devices or ()) if d not in present]
        if missing:
            problems.append(f"{where}.devices: no GPU {', '.join(map(str, missing))} on this node "
                            f"(GPUs: {', '.join(map(str, sorted(present))) or 'none'})")
        refused: dict[tuple[str, str], list[int]] = {}  # (model, why) -> GPUs: one line for all of them
        for g in _selected(gpus, entry):
            if g.index in taken:
                problems.append(f"{where}: GPU {g.index} is already named by entry {taken[g.index]}")
                continue
            taken[g.index] = i
            gp, why = _gpu_plan(g, entry)
            if why:
                refused.setdefault((g.name, why), []).append(g.index)
            out.append(gp)
            if not gp.changes:
                in_place.append((g.index, creation_order(entry.mig_devices)))
        problems += [f"{where}: GPU {', '.join(map(str, idx))} ({model}): {why}"
                     for (model, why), idx in refused.items()]
    untouched = tuple(sorted(present - set(taken)))
    ordered = tuple(sorted(out, key=lambda p: p.index))
    return MigPlan(name, ordered, untouched, tuple(problems), tuple(in_place))


def _gpu_plan(g: GpuMig, entry: MigEntry) -> tuple[GpuPlan, str | None]:
    base = GpuPlan(index=g.index, name=g.name, uuid=g.uuid, mig_enabled=entry.mig_enabled)
    if not g.capable:
        if entry.mig_enabled:
            return base, "not MIG-capable (NVML has no MIG mode for it)"
        return base, None
    mode = None
    if entry.mig_enabled != g.pending:
        mode = "enable" if entry.mig_enabled else "disable"
    reset_pending = mode is None and g.pending != g.current
    have = tuple(canonical(d) for d in g.devices) if g.current else ()
    if not entry.mig_enabled:
        return GpuPlan(index=g.index, name=g.name, uuid=g.uuid, mig_enabled=False, mode=mode,
                       reset_pending=reset_pending, destroy=have), None
    want = creation_order(entry.mig_devices)
    offered = set(g.profiles)
    unknown = sorted({gi_part(p) for p in want} - offered)
    why = None
    if unknown:
        why = (f"MIG profile {', '.join(unknown)} not offered (it offers "
               f"{', '.join(sorted(offered)) or 'none'})")
    same = Counter(have) == Counter(want) and g.current and mode is None
    return GpuPlan(index=g.index, name=g.name, uuid=g.uuid, mig_enabled=True, mode=mode,
                   reset_pending=reset_pending, destroy=() if same else have,
                   create=() if same else want), why
