"""Does a driver support this node's GPUs? Checked before anything is installed or activated.

NVIDIA ships, with every driver, `supported-gpus.json`: one entry per supported PCI device id
(`devid`, optionally `subdevid`/`subvendorid` for one board), its `name`, `features` (`kernelopen`:
the open kernel modules support it) and, for GPUs moved off the current driver, `legacybranch`
(e.g. "470.xx"). Debian's `nvidia-driver` package carries it; the user-space artifact keeps it as
`share/supported-gpus.json` in the version root. `check_support` is pure; `require` reads the
node's NVIDIA display/3D controllers from ROOT/sys/bus/pci/devices and refuses with one line per
GPU that the driver version or flavour does not support:

- the open flavour on a GPU without `kernelopen` (everything before Turing),
- a GPU the branch dropped (listed with a `legacybranch`),
- a GPU the list does not know whose device id is above every id it lists (newer than the branch).

A GPU the list does not know but whose id is older is only noted: NVIDIA's list is not complete
(it omits the Tesla T4, 10de:1eb8, which the same drivers run and name in their GSP table).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from ..pci import NVIDIA_VENDOR_ID, nvidia_gpus, nvidia_pci_id
from ..sysfs import read_bytes

MAX_LIST = 16 << 20  # supported-gpus.json (~1 MiB for 590) or a modules manifest

log = logging.getLogger(__name__)

SUPPORT_FILE = "share/supported-gpus.json"  # inside the user-space artifact / a version root


@dataclass(frozen=True)
class Chip:
    devid: int
    subvendor: int | None
    subdevice: int | None
    name: str
    legacy: str | None  # "470.xx": only that legacy branch supports it
    features: frozenset[str]


@dataclass(frozen=True)
class PciId:
    device: int
    subvendor: int | None = None
    subdevice: int | None = None

    @classmethod
    def parse(cls, text: str) -> PciId:
        """'10de:2330' or '10de:2330:10de:16c1' (vendor:device[:subvendor:subdevice])."""
        parts = text.lower().split(":")
        if len(parts) not in (2, 4) or parts[0] != NVIDIA_VENDOR_ID:
            raise InputError(f"{text!r}: not an NVIDIA PCI id (10de:DEVICE[:SUBVENDOR:SUBDEVICE])")
        try:
            nums = [int(p, 16) for p in parts[1:]]
        except ValueError:
            raise InputError(f"{text!r}: not a hexadecimal PCI id") from None
        return cls(nums[0], *(nums[1:] or (None, None)))

    def __str__(self) -> str:
        return nvidia_pci_id(self.device)


def parse_supported(text: str, *, source: str = "supported-gpus.json") -> tuple[Chip, ...]:
    """The chips of NVIDIA's supported-gpus.json; InputError naming the file when malformed."""
    try:
        data = json.loads(text)
        chips = data["chips"]
        return tuple(
            Chip(
                devid=int(c["devid"], 16),
                subvendor=int(c["subvendorid"], 16) if c.get("subvendorid") else None,
                subdevice=int(c["subdevid"], 16) if c.get("subdevid") else None,
                name=str(c.get("name") or ""),
                legacy=c.get("legacybranch") or None,
                features=frozenset(c.get("features") or ()),
            )
            for c in chips
        )
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise InputError(f"{source}: not NVIDIA's supported-gpus list ({type(e).__name__}: {e})") from None


def _entries(chips: Sequence[Chip], gpu: PciId) -> list[Chip]:
    """The entries for `gpu`: its own board's when listed, else the chip's generic ones, else any."""
    same = [c for c in chips if c.devid == gpu.device]
    board = [c for c in same if c.subdevice is not None
             and (c.subvendor, c.subdevice) == (gpu.subvendor, gpu.subdevice)]
    generic = [c for c in same if c.subdevice is None]
    return board or generic or same


def _supports(chips: Sequence[Chip], gpu: PciId, flavour: str) -> bool:
    found = _entries(chips, gpu)
    current = [c for c in found if c.legacy is None]
    return bool(current) and (flavour != "open" or any("kernelopen" in c.features for c in current))


def check_support(
    supported_json: str,
    flavour: str,
    pci_ids: Sequence[str],
    *,
    driver_version: str = "this driver",
    alternatives: Mapping[str, str] | None = None,
    notes: list[str] | None = None,
) -> list[str]:
    """One problem line per GPU in `pci_ids` that `driver_version` (`flavour`) does not support.

    `alternatives` ({driver version: its supported-gpus.json}, e.g. the other user-space artifacts
    of the store) are named when they would support the GPU; GPUs the list does not know but that
    are not newer than it go to `notes`, not to the problems (the list is incomplete)."""
    chips = parse_supported(supported_json, source=f"supported-gpus.json of {driver_version}")
    others = {
        v: parse_supported(t, source=f"supported-gpus.json of {v}") for v, t in (alternatives or {}).items()
    }
    top = max((c.devid for c in chips), default=0)
    problems = []
    for text in dict.fromkeys(pci_ids):
        gpu = PciId.parse(text)
        if _supports(chips, gpu, flavour):
            continue
        found = _entries(chips, gpu)
        name = next((c.name for c in found), "") or next(
            (c.name for cs in others.values() for c in _entries(cs, gpu) if c.name), f"NVIDIA device {gpu}")
        would = [
            f"{v} ({', '.join(f for f in ('proprietary', 'open') if _supports(cs, gpu, f))})"
            for v, cs in sorted(others.items())
            if _supports(cs, gpu, "proprietary")
        ]
        where = f"; supported by: {', '.join(would)}" if would else ""
        current = [c for c in found if c.legacy is None]
        if current:  # listed, but not for the open modules
            problems.append(
                f"{name} (PCI {gpu}) is not supported by the open kernel modules of {driver_version} "
                f"(NVIDIA lists no 'kernelopen' for it: GPUs before Turing need the proprietary "
                f"modules); use the proprietary flavour of {driver_version}{where}"
            )
        elif found:
            branch = found[0].legacy or ""
            problems.append(
                f"{name} (PCI {gpu}) is not supported by {driver_version}: NVIDIA moved it to the "
                f"{branch} legacy branch; use a {branch.removesuffix('.xx')} driver{where}"
            )
        elif gpu.device > top:
            problems.append(
                f"{name} (PCI {gpu}) is newer than {driver_version}: not in its supported-GPU list, "
                f"whose newest device is {nvidia_pci_id(top)}; use a newer driver branch{where}"
            )
        elif notes is not None:
            notes.append(f"{name} (PCI {gpu}) is not in the supported-GPU list of {driver_version} "
                         "(NVIDIA's list is incomplete; not refused)")
    return problems


def node_pci_ids(root: Path, sys_dir: Path | None = None) -> list[str]:
    """'10de:DEVICE:SUBVENDOR:SUBDEVICE' of the NVIDIA GPUs under SYS/bus/pci/devices (`sys_dir`,
    default ROOT/sys)."""
    found = nvidia_gpus(Path(sys_dir if sys_dir is not None else Path(root) / "sys"))
    return [pci_id for pci_id in (d.pci_id() for d in found) if pci_id is not None]


def installed_flavours(version_dir: Path) -> set[str]:
    """Flavours of the kernel modules installed in a version root (modules/<rel>/manifest.json)."""
    out = set()
    for m in sorted(Path(version_dir).glob("modules/*/manifest.json")):
        try:
            data = json.loads(read_bytes(m, limit=MAX_LIST))  # a link of the image is no manifest
            flavour = data.get("flavour") if isinstance(data, dict) else None
        except (OSError, ValueError):
            continue
        if flavour:
            out.add(str(flavour))
    return out


def problems_for(
    root: Path, version_dir: Path, version: str, flavour: str | None = None, notes: list[str] | None = None
) -> list[str] | None:
    """What `version` (its root at `version_dir`; flavour: given or its installed modules')
    does not support on the node at `root`; None when the root carries no supported-GPU list."""
    path = Path(version_dir) / SUPPORT_FILE
    try:  # a regular file, no link of the image followed, bounded
        text = read_bytes(path, limit=MAX_LIST).decode("utf-8", "replace")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise InputError(f"{path}: {e.strerror or e}; refused") from None
    gpus = node_pci_ids(root)
    flavours = {flavour} if flavour else installed_flavours(version_dir) or {"proprietary"}
    return [
        p for f in sorted(flavours) for p in check_support(text, f, gpus, driver_version=version, notes=notes)
    ]


def require_artifact(root: Path, userspace: Path, version: str, flavour: str | None) -> None:
    """`require` against the list inside user-space artifact `userspace` (read, not extracted)."""
    # lazy: labels --help, Ansible nodeprep_doctor, Ansible nodeprep_labels
    from ..artifact import read_member

    data = read_member(userspace, SUPPORT_FILE)
    if data is None:
        log.info("%s carries no supported-GPU list: GPU support not checked", userspace.name)
        return
    notes: list[str] = []
    problems = check_support(data.decode(), flavour or "proprietary", node_pci_ids(root),
                             driver_version=version, notes=notes)
    for note in dict.fromkeys(notes):
        log.warning("warning: %s", note)
    if problems:
        raise InputError(problems[0], hint="\n".join(problems[1:]) or None)


def require(root: Path, version_dir: Path, version: str, flavour: str | None = None) -> None:
    """Refuse (InputError, nothing changed yet) when `version` does not support the node's GPUs."""
    notes: list[str] = []
    problems = problems_for(root, version_dir, version, flavour, notes)
    for note in dict.fromkeys(notes):
        log.warning("warning: %s", note)
    if problems is None:
        log.info("%s carries no supported-GPU list: GPU support not checked", version)
        return
    if problems:
        raise InputError(problems[0], hint="\n".join(problems[1:]) or None)


# GPUs NVIDIA supports with the open kernel modules only: "For cutting-edge platforms such as NVIDIA
# Grace Hopper or NVIDIA Blackwell, you must use the open-source GPU kernel modules. The proprietary
# drivers are unsupported on these platforms" (NVIDIA, "NVIDIA Transitions Fully Towards Open-Source
# GPU Kernel Modules", July 2024; the R560+ README says the same). Blackwell's PCI device ids start at
# 10de:2900 (B200 10de:2901, RTX PRO 6000 10de:2bb4); Grace Hopper's GH200 are 10de:2342 and 2348.
OPEN_ONLY_FROM_DEVICE = 0x2900
OPEN_ONLY_DEVICES = frozenset({0x2342, 0x2348})


def needs_open(pci_id: str) -> bool:
    """Whether NVIDIA supports the GPU `pci_id` ('10de:2901[:SUBVENDOR:SUBDEVICE]') only with the open
    kernel modules (Blackwell and Grace Hopper); False for anything else, malformed ids included."""
    parts = pci_id.lower().split(":")
    try:
        device = int(parts[1], 16) if len(parts) >= 2 and parts[0] == NVIDIA_VENDOR_ID else None
    except ValueError:
        return False
    return device is not None and (device >= OPEN_ONLY_FROM_DEVICE or device in OPEN_ONLY_DEVICES)
