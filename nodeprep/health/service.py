"""`nodeprep health` at the edges: one look (`look_once`) and the service loop (`serve`), both over
nodeprep.health.nvml (NVML state and its event set) and nodeprep.health.kmsg (the kernel's Xid lines),
judged by nodeprep.health.verdict and, with a kubeconfig, written by nodeprep.health.condition.

The loop waits on NVML's event set (1 s at a time), reads /dev/kmsg without blocking, and reads the
GPUs' state again at once after an event and otherwise every `interval` seconds. NVML that would not
initialise is tried again every `interval`. Nothing it reads can stop it: a failed read is an answer,
an API server that is away is retried (nodeprep.health.condition.Publisher).
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType

from ..errors import NodeprepError
from ..rootpath import beneath
from .kmsg import KernelXid, KmsgReader
from .nvml import Nvml
from .verdict import Held, NodeVerdict, Observations, XidEvent, evaluate, settle, with_rates

log = logging.getLogger(__name__)

KMSG = Path("/dev/kmsg")
MAX_XIDS = 256  # Xids remembered (the newest); older ones fall out of the window anyway
MIG_RECORD = "/var/lib/nodeprep/mig.json"  # what `nodeprep mig` put in place (node.migapply.STATE_FILE)
MAX_RECORD = 256 * 1024
_MIG_PROFILE = re.compile(r"[0-9a-z][0-9a-z.+-]{0,31}")


@dataclass(frozen=True)
class Settings:
    hold: float = 60.0  # seconds a GPU must be healthy before it counts as healthy again
    xid_window: float = 3600.0  # seconds an Xid (action other than ignore) keeps its GPU unhealthy
    interval: float = 2.0  # seconds between reads of the GPUs' state when no event comes
    kmsg: Path | None = KMSG  # None: not read
    settle_ms: int = 500  # one look: how long to wait for events before the final read
    root: Path = Path("/")  # where the MIG record is read (MIG_RECORD under it)


def kernel_event(x: KernelXid, now: float) -> XidEvent:
    """A kmsg Xid on the monotonic clock (the kernel's timestamps are; a line without one: `now`)."""
    at = x.usec / 1e6 if x.usec is not None else now
    return XidEvent(x.code, min(at, now), "kmsg", x.text, pci=x.pci)


def _open_kmsg(path: Path | None, notes: list[str]) -> KmsgReader | None:
    if path is None:
        return None
    try:
        return KmsgReader(path)
    except OSError as e:
        notes.append(f"{path}: not read ({e.strerror or e}); Xids come from NVML's events only")
        return None


def mig_layout(root: Path) -> dict[str, tuple[str, ...]]:
    """GPU UUID -> its MIG devices as the record of `nodeprep mig` names them (`MIG 1g.10gb Device 0`,
    as nvidia-smi -L does), for MIG devices NVML does not list; {} without a successful record. The
    record is input like any file under the root: bounded, checked, an unreadable one is no record."""
    try:
        fd = os.open(beneath(Path(root), MIG_RECORD), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, NodeprepError):
        return {}
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or a device is no record
            return {}
        raw = os.read(fd, MAX_RECORD + 1)
        data = json.loads(raw) if len(raw) <= MAX_RECORD else None
    except (OSError, ValueError):
        return {}
    finally:
        os.close(fd)
    if not isinstance(data, dict) or data.get("state") != "success" or \
            not isinstance(data.get("layout"), list):
        return {}
    out: dict[str, tuple[str, ...]] = {}
    for g in data["layout"][:64]:
        devices = g.get("mig_devices") if isinstance(g, dict) else None
        if not isinstance(g, dict) or not isinstance(g.get("uuid"), str) or not isinstance(devices, list):
            continue
        names = [d for d in devices[:8] if isinstance(d, str) and _MIG_PROFILE.fullmatch(d)]
        if names and len(names) == len(devices[:8]):
            out[g["uuid"][:96]] = tuple(f"MIG {d} Device {i}" for i, d in enumerate(names))
    return out


def with_layout(obs: Observations, layout: dict[str, tuple[str, ...]]) -> Observations:
    """`obs` with each GPU's MIG devices from the record where NVML listed none."""
    if not layout:
        return obs
    return replace(obs, gpus=tuple(g if g.mig_children or g.uuid not in layout
                                   else replace(g, mig_children=layout[g.uuid]) for g in obs.gpus))


def _remember(xids: list[XidEvent], new: list[XidEvent], now: float, window: float) -> list[XidEvent]:
    kept = [x for x in xids + new if now - x.at <= window]
    return kept[-MAX_XIDS:]


def look_once(settings: Settings) -> tuple[Observations, list[str]]:
    """One look: NVML's state, the Xids kmsg holds, and the events of `settle_ms`; then the state
    again (a fault the first read started shows)."""
    notes: list[str] = []
    nvml = Nvml.open()
    try:
        notes += nvml.register_events()
        kmsg = _open_kmsg(settings.kmsg, notes)
        now = time.monotonic()
        xids = [kernel_event(x, now) for x in (kmsg.read() if kmsg else [])]
        if kmsg:
            kmsg.close()
        first, at = nvml.observe(), time.monotonic()
        xids += nvml.wait(settings.settle_ms) if nvml.error is None else []
        now = time.monotonic()
        obs = nvml.observe(tuple(_remember([], xids, now, settings.xid_window)))
        return with_layout(with_rates(first, obs, time.monotonic() - at), mig_layout(settings.root)), notes
    finally:
        nvml.close()


def judge(obs: Observations, settings: Settings, held: Held | None = None) -> tuple[Held, NodeVerdict]:
    now = time.monotonic()
    return settle(held or Held(), evaluate(obs, now, xid_window=settings.xid_window), now, hold=settings.hold)


class Stop:
    """Set by SIGTERM/SIGINT: the loop ends after its current wait."""

    def __init__(self) -> None:
        self.stopped = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._set)

    def _set(self, signum: int, frame: FrameType | None) -> None:
        self.stopped = True

    def __call__(self) -> bool:
        return self.stopped


def serve(settings: Settings, publish: Callable[[NodeVerdict], str | None] | None,
          echo: Callable[[str], None], stop: Callable[[], bool]) -> None:
    """The service: until `stop()`, judge and hand every verdict to `publish` (None: print changes)."""
    notes: list[str] = []
    nvml = Nvml.open()
    notes += nvml.register_events()
    kmsg = _open_kmsg(settings.kmsg, notes)
    for note in notes:
        echo(note)
    xids: list[XidEvent] = []
    held = Held()
    verdict: NodeVerdict | None = None
    shown: tuple[str, str] | None = None
    next_read = 0.0
    last: tuple[Observations, float] | None = None  # the previous read, for the counters' rates
    try:
        while not stop():
            new = nvml.wait(1000)  # sleeps the second out when NVML is not there
            now = time.monotonic()
            if kmsg is not None:
                try:
                    new += [kernel_event(x, now) for x in kmsg.read()]
                except OSError as e:
                    echo(f"{settings.kmsg}: reading stopped ({e})")
                    kmsg.close()
                    kmsg = None
            if nvml.error is not None and now >= next_read:
                nvml.close()
                nvml = Nvml.open()
                if nvml.error is None:
                    echo("NVML is available again")
                    for note in nvml.register_events():
                        echo(note)
            if new or now >= next_read or verdict is None:
                xids = _remember(xids, new, now, settings.xid_window)
                obs = with_layout(nvml.observe(tuple(xids)), mig_layout(settings.root))
                read_at = time.monotonic()
                rated = with_rates(last[0], obs, read_at - last[1]) if last else obs
                last = (obs, read_at)
                raw = evaluate(rated, now, xid_window=settings.xid_window)
                held, verdict = settle(held, raw, now, hold=settings.hold)
                next_read = now + settings.interval
            if publish is not None:
                line = publish(verdict)
                if line:
                    echo(line)
            elif (verdict.status, verdict.message) != shown:
                shown = (verdict.status, verdict.message)
                echo(f"GPUHealthy={verdict.status} reason {verdict.reason}: {verdict.message}")
    finally:
        if kmsg is not None:
            kmsg.close()
        nvml.close()
