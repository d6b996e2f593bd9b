"""The NVML side of `nodeprep health` (nvidia-ml-py): `Nvml.observe()` reads each GPU's state into
nodeprep.health.verdict observations, and an event set (`nvmlEventSetCreate`,
`nvmlDeviceRegisterEvents`, `nvmlEventSetWait`) delivers Xid and ECC events as they happen.

What a GPU answers is read, never trusted beyond its type: an NVML error on one read is that read's
answer (GPU_IS_LOST: the GPU is lost; NOT_SUPPORTED: the feature is absent), never a crash of the
service. A GPU's identity (UUID, PCI address) is remembered from the first read that gave it, so a GPU
that is lost later is still named.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .verdict import GpuObservation, Observations, XidEvent

log = logging.getLogger(__name__)

T = TypeVar("T")
EVENTS = ("nvmlEventTypeXidCriticalError", "nvmlEventTypeDoubleBitEccError")
MAX_GPUS = 64
MAX_LINKS = 36  # NVML_NVLINK_MAX_LINKS
NVLINK_COUNTERS = {"replay": 0, "recovery": 1, "crc_flit": 2, "crc_data": 3}  # NVML_NVLINK_ERROR_DL_*


class Lost(Exception):
    """A read answered GPU_IS_LOST (or another error that means the GPU is not reachable)."""


def _text(value: Any) -> str:
    out = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return "".join(c for c in out if c.isprintable())[:96]


@dataclass
class Identity:
    uuid: str = "unknown"
    pci: str = "unknown"


@dataclass
class Nvml:
    """One NVML session (nvmlInit .. nvmlShutdown) with its event set."""

    nv: Any = None
    error: str | None = None
    names: dict[int, Identity] = field(default_factory=dict)
    count: int = 0
    event_set: Any = None
    handles: dict[int, int] = field(default_factory=dict)  # handle address -> GPU index

    @classmethod
    def open(cls) -> Nvml:
        """NVML initialised, or an instance whose `error` says why not."""
        try:
            import pynvml
        except ImportError as e:  # nvidia-ml-py is a dependency; a broken install says so
            return cls(error=f"nvidia-ml-py cannot be imported ({e})")
        self = cls(nv=pynvml)
        try:
            pynvml.nvmlInit()
            self.count = min(int(pynvml.nvmlDeviceGetCount()), MAX_GPUS)
        except pynvml.NVMLError as e:
            self.error = f"nvmlInit: {e}"
            return self
        for i in range(self.count):
            self.names[i] = Identity()
            self._identify(i)
        return self

    def _identify(self, index: int) -> None:
        nv, ident = self.nv, self.names[index]
        try:
            h = nv.nvmlDeviceGetHandleByIndex(index)
            if ident.uuid == "unknown":
                ident.uuid = _text(nv.nvmlDeviceGetUUID(h))
            if ident.pci == "unknown":
                ident.pci = _text(nv.nvmlDeviceGetPciInfo(h).busId)
        except nv.NVMLError as e:
            log.debug("GPU %d: identity not read (%s)", index, e)

    def _call(self, fn: Callable[..., T], *args: Any) -> T | None:
        """`fn(*args)`; None when NVML says the feature is not there; Lost when the GPU is gone."""
        nv = self.nv
        try:
            return fn(*args)
        except nv.NVMLError as e:
            if e.value == nv.NVML_ERROR_GPU_IS_LOST:
                raise Lost(str(e)) from None
            return None

    def register_events(self) -> list[str]:
        """The event set over every GPU that takes it; one note per GPU that did not."""
        nv, notes = self.nv, []
        if self.error is not None:
            return []
        wanted = 0
        for name in EVENTS:
            wanted |= int(getattr(nv, name))
        try:
            self.event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as e:
            return [f"nvmlEventSetCreate: {e}"]
        for i in range(self.count):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                self.handles[ctypes.cast(h, ctypes.c_void_p).value or 0] = i
                supported = int(nv.nvmlDeviceGetSupportedEventTypes(h))
                nv.nvmlDeviceRegisterEvents(h, wanted & supported, self.event_set)
            except nv.NVMLError as e:
                notes.append(f"GPU {i}: events not registered ({e})")
        return notes

    def wait(self, timeout_ms: int) -> list[XidEvent]:
        """Events of the next `timeout_ms` (at most 64 of them; the first waits, the rest are drained)."""
        nv = self.nv
        if self.event_set is None:
            time.sleep(timeout_ms / 1000)
            return []
        out: list[XidEvent] = []
        wait = timeout_ms
        for _ in range(64):
            try:
                ev = nv.nvmlEventSetWait(self.event_set, wait)
            except nv.NVMLError as e:
                if e.value not in (nv.NVML_ERROR_TIMEOUT,):
                    log.debug("nvmlEventSetWait: %s", e)
                    if not out:
                        time.sleep(wait / 1000)
                break
            wait = 1  # drain what is queued (a wait of 0 ms may return before a queued event)
            index = self.handles.get(ctypes.cast(ev.device, ctypes.c_void_p).value or 0)
            if int(ev.eventType) & int(nv.nvmlEventTypeXidCriticalError):
                out.append(XidEvent(int(ev.eventData) & 0xFFFF, time.monotonic(), "nvml", index=index))
            else:
                # NVML's double bit ECC event is what Xid 48 reports in the kernel log
                out.append(XidEvent(48, time.monotonic(), "nvml", "double bit ECC error event", index=index))
        return out

    def _gpu(self, index: int) -> GpuObservation:
        nv, ident = self.nv, self.names[index]
        if ident.uuid == "unknown" or ident.pci == "unknown":
            self._identify(index)
        base = GpuObservation(index, ident.uuid, ident.pci)
        try:
            h = self._call(nv.nvmlDeviceGetHandleByIndex, index)
            if h is None:
                return GpuObservation(index, ident.uuid, ident.pci, lost="no handle")
            self._call(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)  # does it answer at all
            ecc = self._call(nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                             nv.NVML_VOLATILE_ECC)
            rows = self._call(nv.nvmlDeviceGetRemappedRows, h)
            retired = self._call(nv.nvmlDeviceGetRetiredPagesPendingStatus, h) if rows is None else None
            links: list[bool] = []
            errors: dict[str, int] = {}
            for link in range(self._link_count(h)):
                state = self._call(nv.nvmlDeviceGetNvLinkState, h, link)
                if state is None:
                    break
                links.append(bool(state))
                for name, counter in NVLINK_COUNTERS.items():
                    value = self._call(nv.nvmlDeviceGetNvLinkErrorCounter, h, link, counter)
                    if isinstance(value, int):
                        errors[name] = errors.get(name, 0) + value
            fabric_state = fabric_status = None
            info = nv.c_nvmlGpuFabricInfo_t()
            if self._call(nv.nvmlDeviceGetGpuFabricInfo, h, ctypes.byref(info)) is not None:  # NVML_SUCCESS
                fabric_state, fabric_status = int(info.state), int(info.status)
            children = self._mig_children(h)
        except Lost as e:
            return GpuObservation(index, ident.uuid, ident.pci, lost=str(e))
        return GpuObservation(
            base.index, base.uuid, base.pci,
            ecc_uncorrected=int(ecc) if isinstance(ecc, int) else None,
            remap_pending=bool(rows and rows[2]), remap_failure=bool(rows and rows[3]),
            retired_pending=bool(retired), nvlink_active=tuple(links), nvlink_errors=errors,
            fabric_state=fabric_state, fabric_status=fabric_status, mig_children=children)

    def _link_count(self, h: Any) -> int:
        """How many NVLinks the GPU has (NVML_FI_DEV_NVLINK_LINK_COUNT), else every index NVML answers
        for: a link index beyond the GPU's links reads as inactive, not as missing."""
        nv = self.nv
        values = self._call(nv.nvmlDeviceGetFieldValues, h, [nv.NVML_FI_DEV_NVLINK_LINK_COUNT])
        if values and int(values[0].nvmlReturn) == 0:
            return max(0, min(int(values[0].value.uiVal), MAX_LINKS))
        return MAX_LINKS

    def _mig_children(self, h: Any) -> tuple[str, ...]:
        nv = self.nv
        mode = self._call(nv.nvmlDeviceGetMigMode, h)
        if not mode or not mode[0]:
            return ()
        top = self._call(nv.nvmlDeviceGetMaxMigDeviceCount, h) or 0
        out = []
        for i in range(min(int(top), 8)):
            child = self._call(nv.nvmlDeviceGetMigDeviceHandleByIndex, h, i)
            if child is not None:
                uuid = self._call(nv.nvmlDeviceGetUUID, child)
                if uuid:
                    out.append(_text(uuid))
        return tuple(out)

    def observe(self, xids: tuple[XidEvent, ...] = ()) -> Observations:
        if self.error is not None:
            return Observations((), xids, nvml_error=self.error)
        return Observations(tuple(self._gpu(i) for i in range(self.count)), xids)

    def close(self) -> None:
        if self.nv is None or self.error is not None:
            return
        try:
            if self.event_set is not None:
                self.nv.nvmlEventSetFree(self.event_set)
            self.nv.nvmlShutdown()
        except self.nv.NVMLError:
            pass
