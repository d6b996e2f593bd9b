"""NVIDIA device names from the pci.ids database (pciutils format), parsed for one vendor only."""

from __future__ import annotations

import functools
import gzip
import io
import logging
import os
import re
import zlib
from pathlib import Path

from ..pci import NVIDIA_VENDOR_ID
from ..sysfs import UnsafeFile, read_bytes

log = logging.getLogger(__name__)

NVIDIA_VENDOR = NVIDIA_VENDOR_ID
MAX_PCI_IDS = 16 << 20  # the full database is ~1.4 MB
SEARCH_PATHS = (
    "/usr/share/misc/pci.ids",
    "/usr/share/hwdata/pci.ids",
    "/usr/share/pci.ids",
    "/usr/share/misc/pci.ids.gz",
    "/usr/share/hwdata/pci.ids.gz",
)
_CHIP_RE = re.compile(r"^((?:GK|GM|GP|GV|TU|GA|AD|GH|GB)\d{2,3})")

# CUDA compute capability per GPU chip (NVIDIA's "CUDA GPUs" compute capability table).
CHIP_COMPUTE: dict[str, tuple[int, int]] = {
    "GK104": (3, 0), "GK106": (3, 0), "GK107": (3, 0), "GK110": (3, 5), "GK208": (3, 5), "GK210": (3, 7),
    "GM107": (5, 0), "GM108": (5, 0), "GM200": (5, 2), "GM204": (5, 2), "GM206": (5, 2),
    "GP100": (6, 0), "GP102": (6, 1), "GP104": (6, 1), "GP106": (6, 1), "GP107": (6, 1), "GP108": (6, 1),
    "GV100": (7, 0),
    "TU102": (7, 5), "TU104": (7, 5), "TU106": (7, 5), "TU116": (7, 5), "TU117": (7, 5),
    "GA100": (8, 0), "GA102": (8, 6), "GA103": (8, 6), "GA104": (8, 6), "GA106": (8, 6), "GA107": (8, 6),
    "AD102": (8, 9), "AD103": (8, 9), "AD104": (8, 9), "AD106": (8, 9), "AD107": (8, 9),
    "GH100": (9, 0),
    "GB100": (10, 0), "GB102": (10, 0),
    "GB202": (12, 0), "GB203": (12, 0), "GB205": (12, 0), "GB206": (12, 0), "GB207": (12, 0),
}


def find_pci_ids(explicit: Path | None = None) -> Path | None:
    """The pci.ids file to use: `explicit`, $NODEPREP_PCI_IDS, then the usual distribution paths."""
    candidates = [explicit] if explicit else []
    if os.environ.get("NODEPREP_PCI_IDS"):
        candidates.append(Path(os.environ["NODEPREP_PCI_IDS"]))
    candidates += [Path(p) for p in SEARCH_PATHS]
    for path in candidates:
        if path and path.is_file():
            return path
    return None


def _read(path: Path) -> str:
    """The database's text: a regular file (never a FIFO), bounded before and after gunzip."""
    raw = read_bytes(path, limit=MAX_PCI_IDS, follow=True)
    if path.suffix == ".gz":
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as f:
            raw = f.read(MAX_PCI_IDS + 1)
        if len(raw) > MAX_PCI_IDS:
            raise UnsafeFile(27, f"{path}: more than {MAX_PCI_IDS} bytes uncompressed")
    return raw.decode("utf-8", errors="replace")


def parse_vendor(text: str, vendor: str = NVIDIA_VENDOR) -> dict[str, str]:
    """{device id (4 lower-case hex): name} for `vendor`; only that vendor's block is scanned."""
    vendor = vendor.lower()
    start = text.find(f"\n{vendor}  ")
    if start < 0:
        return {}
    devices: dict[str, str] = {}
    lines = iter(text[start + 1:].splitlines())
    next(lines)  # the vendor line itself
    for line in lines:
        if not line or line.startswith("#"):
            continue
        if not line.startswith("\t"):
            break  # next vendor (or class section)
        if line.startswith("\t\t"):
            continue  # subsystem entries
        dev, _, name = line[1:].partition(" ")
        if len(dev) == 4:
            devices[dev.lower()] = name.strip()
    return devices


@functools.lru_cache(maxsize=8)
def _load(path: str, mtime: float) -> dict[str, str]:
    return parse_vendor(_read(Path(path)))


def nvidia_devices(path: Path | None = None) -> dict[str, str]:
    """Device id -> pci.ids name for NVIDIA ({} when no database is installed)."""
    found = find_pci_ids(path)
    if found is None:
        return {}
    try:
        return _load(str(found), found.stat().st_mtime)
    except (OSError, EOFError, zlib.error) as e:  # unreadable, unsafe, or a broken .gz
        log.debug("cannot read %s: %s", found, e)
        return {}


def chip_of(pci_name: str) -> str | None:
    """'GA100 [A100 SXM4 80GB]' -> 'GA100'; 'TU104GL [Tesla T4]' -> 'TU104'."""
    m = _CHIP_RE.match(pci_name.strip())
    return m.group(1) if m else None


def marketing_name(pci_name: str) -> str:
    """A product name close to NVML's: the bracketed part, with 'NVIDIA ' in front as modern drivers
    report it ('GH100 [H100 SXM5 80GB]' -> 'NVIDIA H100 SXM5 80GB'; Tesla-branded names stay)."""
    m = re.search(r"\[([^\]]+)\]", pci_name)
    name = (m.group(1) if m else pci_name).strip()
    if not name.startswith(("NVIDIA", "Tesla")):
        name = f"NVIDIA {name}"
    return name
