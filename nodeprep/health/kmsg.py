"""The kernel's NVRM Xid lines: a pure parser (`parse_record`, `parse_xid`) and a bounded reader of
/dev/kmsg (`KmsgReader`) for the Xids NVML's event set does not deliver (a GPU that fell off the bus
before it was registered, Xids logged before the service started).

The lines the driver writes look like (NVIDIA's open kernel modules, real reports):

    NVRM: Xid (PCI:0000:1a:00): 79, pid=1234, name=python3, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to
        activate.                                                     (one line in the log)
    NVRM: Xid (PCI:0000:65:00): 119, pid='N/A', Timeout waiting for RPC from GSP
    NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)
    NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007 M 00001ffc Data ffffffff      (older drivers)

A /dev/kmsg record is `PRIO,SEQ,USEC,FLAGS;MESSAGE` (Documentation/ABI/testing/dev-kmsg); a dmesg
line `[  123.456789] MESSAGE` is read too (recorded captures). Everything is hostile: a line is
looked at only up to MAX_LINE bytes, matched whole against one pattern, and only the code, the PCI
address and a printable excerpt of the rest are kept.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MAX_LINE = 2048  # a kmsg record is at most 1 KiB of text (LOG_LINE_MAX) plus its prefix
MAX_TEXT = 160
MAX_BUFFER = 64 * 1024  # bytes kept of a partial line from a plain file before it is dropped

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?\): "
                  r"([0-9]{1,5})(?:,[ ]?(.*))?")
_KMSG = re.compile(r"([0-9]{1,3}),([0-9]{1,20}),([0-9]{1,20}),[^;]{0,16};(.*)", re.S)
_DMESG = re.compile(r"\[ *([0-9]{1,12})\.([0-9]{1,9})\] (.*)", re.S)
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")


@dataclass(frozen=True)
class KernelXid:
    code: int
    pci: str  # "dddd:bb:dd", the domain 4 hex digits, lower case: what the line names
    text: str  # the rest of the line, printable ASCII, at most MAX_TEXT characters
    usec: int | None  # microseconds since boot (CLOCK_MONOTONIC) when the record has them


def pci_key(bus_id: str) -> str | None:
    """`dddd:bb:dd` of a PCI address as NVML (`00000000:1A:00.0`) or NVRM (`0000:1a:00`) spells it."""
    m = re.fullmatch(r"([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?", bus_id.strip())
    if not m:
        return None
    return f"{int(m.group(1), 16):04x}:{m.group(2).lower()}:{m.group(3).lower()}"


def parse_xid(message: str, usec: int | None = None) -> KernelXid | None:
    """The Xid an NVRM message reports, or None for any other message."""
    message = message[:MAX_LINE]
    at = message.find("NVRM: Xid (")
    if at < 0:
        return None
    m = _XID.fullmatch(message[at:].rstrip("\r\n"))
    if not m:
        return None
    pci = pci_key(f"{m.group(1)}:{m.group(2)}:{m.group(3)}")
    if pci is None:
        return None
    text = _UNPRINTABLE.sub("?", (m.group(5) or "").strip())[:MAX_TEXT]
    return KernelXid(int(m.group(4)), pci, text, usec)


def parse_record(record: str) -> KernelXid | None:
    """One /dev/kmsg record or dmesg line (its first line: continuation lines are key=value pairs)."""
    record = record[:MAX_LINE].split("\n", 1)[0]
    m = _KMSG.fullmatch(record)
    if m:
        return parse_xid(m.group(4), int(m.group(3)))
    m = _DMESG.fullmatch(record)
    if m:
        return parse_xid(m.group(3), int(m.group(1)) * 1_000_000 + int(m.group(2).ljust(6, "0")[:6]))
    return parse_xid(record)


class KmsgReader:
    """Non-blocking reader of /dev/kmsg (one record per read(2); EPIPE when records were overwritten
    is skipped) or of a plain file or FIFO of records (captures, tests: read as lines as they grow).
    `fileno()` is there to poll on; `read()` returns the Xids of what is there now."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self.device = not Path(path).is_file() and not self._fifo()
        self._partial = b""

    def _fifo(self) -> bool:
        return stat.S_ISFIFO(os.fstat(self.fd).st_mode)

    def fileno(self) -> int:
        return self.fd

    def _chunks(self) -> Iterator[bytes]:
        for _ in range(4096):  # at most this many reads per call: a flood cannot hold the loop
            try:
                chunk = os.read(self.fd, 8192)
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno == errno.EPIPE:  # records overwritten before we read them
                    continue
                if e.errno == errno.EINVAL:  # a record longer than our buffer
                    continue
                raise
            if not chunk:
                return
            yield chunk

    def read(self) -> list[KernelXid]:
        out = []
        for chunk in self._chunks():
            if self.device:
                lines = [chunk]
            else:
                data = self._partial + chunk
                *lines, self._partial = data.split(b"\n")
                if len(self._partial) > MAX_BUFFER:
                    self._partial = b""
            for raw in lines:
                xid = parse_record(raw[:MAX_LINE].decode("utf-8", "replace"))
                if xid is not None:
                    out.append(xid)
        return out

    def close(self) -> None:
        os.close(self.fd)
