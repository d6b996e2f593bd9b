"""The MIG layout through NVML (nvidia-ml-py, opened by nodeprep.labels.gpu.nvml_session): read each
GPU's MIG state for the planner (nodeprep.node.migplan), carry a plan out, and record the outcome in
ROOT/var/lib/nodeprep/mig.json (the config and mig-manager's `nvidia.com/mig.config.state` value the
labels read back).

Applying a plan, per GPU in index order: destroy its MIG devices (compute instances, then GPU
instances), set MIG mode, read the mode back (a mode that takes effect only at the next GPU reset
leaves the GPU `pending` and creates nothing on it), then create each MIG device (a GPU instance and
its compute instance). The first NVML error stops the run: state `failed`, naming the GPU and call."""

from __future__ import annotations

import json
import math
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..atomicfile import atomic_write
from ..errors import StateError
from ..labels.gpu import nvml_session
from ..profile.fields import field_error
from ..rootpath import beneath
from .migplan import STATE_FAILED, STATE_PENDING, STATE_SUCCESS, GpuMig, MigPlan
from .migplan import plan as make_plan

STATE_FILE = "/var/lib/nodeprep/mig.json"  # read by nodeprep.labels.system (MIG_STATE_FILE)
# NVML's GPU instance profile ids whose name has an attribute (nvml.h, as go-nvlib names them).
GI_ATTRIBUTES = {7: "+me", 8: "+me", 10: "+gfx", 11: "+gfx", 12: "+gfx", 13: "-me", 14: "-me",
                 15: "+me.all", 16: "+me.all"}
# compute instance slices -> NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE
CI_PROFILE = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
GI_PROFILE_COUNT = 17  # ids 0 .. NVML_GPU_INSTANCE_PROFILE_COUNT-1 of nvidia-ml-py 13


class NvmlUnavailable(StateError):
    """NVML cannot be asked here (no library, no driver)."""


@dataclass
class Outcome:
    config: str
    state: str  # success | pending | failed
    done: list[str] = field(default_factory=list)
    error: str | None = None
    # per GPU put in place: {"index", "uuid", "mig_devices": [profile, ...]} (read by nodeprep health)
    layout: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config, "state": self.state, "done": self.done, "error": self.error,
                "layout": self.layout}


def nvml() -> AbstractContextManager[Any]:
    """An initialised nvidia-ml-py module (NvmlUnavailable when there is none)."""
    return nvml_session(NvmlUnavailable)


def mig_memory_gb(total_bytes: int, mig_mib: int) -> int:
    """go-nvlib's getMigMemorySizeGB: the profile's share of the GPU's memory in eighths, times the
    GPU's memory in whole GB (pure)."""
    one_gb = 1 << 30
    fraction = math.ceil(mig_mib * (1 << 20) / total_bytes * 8) / 8
    return round(fraction * ((total_bytes + one_gb - 1) // one_gb))


def gi_name(profile_id: int, slices: int, mig_mib: int, total_bytes: int) -> str:
    return f"{slices}g.{mig_memory_gb(total_bytes, mig_mib)}gb{GI_ATTRIBUTES.get(profile_id, '')}"


def _gi_profiles(nv: Any, handle: Any, total: int) -> dict[int, tuple[str, Any]]:
    """GPU instance profile id -> (name, NVML's info) for each profile this GPU offers (NVML answers
    NOT_SUPPORTED or INVALID_ARGUMENT for the others)."""
    out = {}
    for pid in range(GI_PROFILE_COUNT):
        try:
            info = nv.nvmlDeviceGetGpuInstanceProfileInfo(handle, pid)
        except nv.NVMLError:
            continue
        out[pid] = (gi_name(pid, int(info.sliceCount), int(info.memorySizeMB), total), info)
    return out


def _instances(nv: Any, handle: Any, info: Any) -> list[Any]:
    """The GPU instances of one profile (empty where NVML lists none)."""
    count = max(int(info.instanceCount), 1)
    array = (nv.c_nvmlGpuInstance_t * count)()
    n = nv.c_uint(0)
    try:
        nv.nvmlDeviceGetGpuInstances(handle, info.id, array, nv.byref(n))
    except nv.NVMLError:
        return []
    return list(array[: n.value])


def _compute(nv: Any, gi: Any) -> list[tuple[int, Any]]:
    """(slices, handle) of each compute instance of a GPU instance."""
    out = []
    for slices, cid in CI_PROFILE.items():
        try:
            ci_info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, cid, 0)
        except nv.NVMLError:
            continue
        array = (nv.c_nvmlComputeInstance_t * max(int(ci_info.instanceCount), 1))()
        n = nv.c_uint(0)
        try:
            nv.nvmlGpuInstanceGetComputeInstances(gi, ci_info.id, array, nv.byref(n))
        except nv.NVMLError:
            continue
        out += [(slices, c) for c in array[: n.value]]
    return out


def _opt(nv: Any, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except nv.NVMLError:
        return None


def _s(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _gpu(nv: Any, index: int) -> GpuMig:
    handle = nv.nvmlDeviceGetHandleByIndex(index)
    mode = _opt(nv, nv.nvmlDeviceGetMigMode, handle)
    pci = _opt(nv, nv.nvmlDeviceGetPciInfo, handle)
    mem = _opt(nv, nv.nvmlDeviceGetMemoryInfo, handle)
    current = bool(mode and mode[0] == nv.NVML_DEVICE_MIG_ENABLE)
    profiles: dict[int, tuple[str, Any]] = {}
    devices: list[str] = []
    if mode is not None and mem is not None:
        profiles = _gi_profiles(nv, handle, int(mem.total))
        if current:
            for name, info in profiles.values():
                slices = int(info.sliceCount)
                for gi in _instances(nv, handle, info):
                    devices += [name if c == slices else f"{c}c.{name}" for c, _ in _compute(nv, gi)]
    return GpuMig(index=index, uuid=_s(_opt(nv, nv.nvmlDeviceGetUUID, handle) or ""),
                  name=_s(nv.nvmlDeviceGetName(handle)),
                  pci_id=f"0x{pci.pciDeviceId:08X}" if pci is not None else "",
                  capable=mode is not None, current=current,
                  pending=bool(mode and mode[1] == nv.NVML_DEVICE_MIG_ENABLE),
                  profiles=tuple(sorted({n for n, _ in profiles.values()})), devices=tuple(sorted(devices)))


def read_gpus() -> tuple[GpuMig, ...]:
    """Every GPU's MIG state, from NVML."""
    with nvml() as nv:
        try:
            return tuple(_gpu(nv, i) for i in range(nv.nvmlDeviceGetCount()))
        except nv.NVMLError as e:
            raise NvmlUnavailable(f"NVML: {e}") from None


def _destroy_all(nv: Any, handle: Any) -> int:
    mem = nv.nvmlDeviceGetMemoryInfo(handle)
    gone = 0
    for _, info in _gi_profiles(nv, handle, int(mem.total)).values():
        for gi in _instances(nv, handle, info):
            for _, ci in _compute(nv, gi):
                nv.nvmlComputeInstanceDestroy(ci)
            nv.nvmlGpuInstanceDestroy(gi)
            gone += 1
    return gone


def _create(nv: Any, handle: Any, profile: str) -> None:
    mem = nv.nvmlDeviceGetMemoryInfo(handle)
    gi_part = profile.split(".", 1)[1] if profile.split(".", 1)[0].endswith("c") else profile
    found = [(pid, info) for pid, (name, info) in _gi_profiles(nv, handle, int(mem.total)).items()
             if name == gi_part]
    if not found:
        raise StateError(f"MIG profile {gi_part} is not offered")
    pid, info = found[0]
    gi = nv.nvmlDeviceCreateGpuInstance(handle, pid)
    slices = int(profile.split("c.", 1)[0]) if gi_part != profile else int(info.sliceCount)
    if slices not in CI_PROFILE:
        raise StateError(f"{profile}: no compute instance profile of {slices} slices")
    ci_info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, CI_PROFILE[slices], 0)
    nv.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)


def apply(plan: MigPlan) -> Outcome:
    """Carry `plan` out through NVML (a plan with problems is refused before NVML is touched)."""
    if plan.problems:
        raise StateError("; ".join(plan.problems))
    out = Outcome(plan.config, STATE_SUCCESS)
    if not plan.changes:
        out.state = STATE_PENDING if any(g.reset_pending for g in plan.gpus) else STATE_SUCCESS
        return out
    with nvml() as nv:
        for g in plan.gpus:
            if not g.changes:
                out.state = STATE_PENDING if g.reset_pending else out.state
                continue
            step = "nvmlDeviceGetHandleByUUID"
            try:
                handle = (nv.nvmlDeviceGetHandleByUUID(g.uuid) if g.uuid
                          else nv.nvmlDeviceGetHandleByIndex(g.index))
                if g.destroy:
                    step = "destroying MIG devices"
                    out.done.append(f"GPU {g.index}: destroyed {_destroy_all(nv, handle)} GPU instance(s)")
                if g.mode:
                    step = "nvmlDeviceSetMigMode"
                    nv.nvmlDeviceSetMigMode(handle, nv.NVML_DEVICE_MIG_ENABLE if g.mode == "enable"
                                            else nv.NVML_DEVICE_MIG_DISABLE)
                    out.done.append(f"GPU {g.index}: MIG mode {g.mode}d")
                current = nv.nvmlDeviceGetMigMode(handle)[0] == nv.NVML_DEVICE_MIG_ENABLE
                if current != g.mig_enabled:
                    out.state = STATE_PENDING
                    out.done.append(f"GPU {g.index}: MIG mode takes effect at the next GPU reset")
                    continue
                for profile in g.create:
                    step = f"creating {profile}"
                    _create(nv, handle, profile)
                if g.create:
                    out.done.append(f"GPU {g.index}: created {len(g.create)} MIG device(s)")
            except (nv.NVMLError, StateError) as e:
                out.state, out.error = STATE_FAILED, f"GPU {g.index} ({g.name}): {step}: {e}"
                return out
    return out


def layout_of(todo: MigPlan) -> list[dict[str, Any]]:
    """Each MIG-enabled GPU of a plan carried out, with the MIG devices it now has (created, or found
    in place), by profile name in creation order."""
    in_place = dict(todo.in_place)
    return [{"index": g.index, "uuid": g.uuid, "mig_devices": list(g.create or in_place.get(g.index, ()))}
            for g in todo.gpus if g.mig_enabled]


def record(root: Path, outcome: Outcome) -> bool:
    """Write ROOT/var/lib/nodeprep/mig.json (False: unchanged)."""
    path = beneath(Path(root), STATE_FILE, follow_last=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, json.dumps(outcome.to_dict(), indent=2, sort_keys=True) + "\n")


def run(root: Path, spec: dict[str, Any] | None, select: str | None, *, check: bool) -> dict[str, Any]:
    """The profile's MIG layout on this host's GPUs: plan (and, unless `check`, apply and record in
    ROOT/var/lib/nodeprep/mig.json). A plan with problems is refused (InputError naming mig.config);
    an NVML error while applying is recorded as `failed` and raised (StateError)."""
    if spec is None:
        return {"changes": False, "summary": "no mig.config in the profile: MIG left as it is"}
    todo = make_plan(read_gpus(), spec, select)
    if todo.problems:
        raise field_error("mig.config", "; ".join(p.removeprefix("mig.config: ") for p in todo.problems))
    data = todo.to_dict()
    if check:
        data["summary"] = (f"would apply MIG config {todo.config}" if todo.changes
                           else f"MIG config {todo.config}: in place")
        return data
    outcome = apply(todo)
    outcome.layout = layout_of(todo) if outcome.state == STATE_SUCCESS else []
    record(root, outcome)
    data["outcome"] = outcome.to_dict()
    if outcome.state == STATE_FAILED:
        raise StateError(f"MIG config {todo.config}: {outcome.error}",
                         hint=f"recorded in {STATE_FILE} (nvidia.com/mig.config.state=failed)")
    data["summary"] = (f"MIG config {todo.config}: {outcome.state}"
                       + ("" if todo.changes else " (in place, nothing changed)"))
    return data
