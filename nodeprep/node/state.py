"""What is installed and active on a node.

The filesystem is the truth; state.json adds history. A version is installed when
/opt/nvidia/<v>/manifest.json exists (the directory only appears by rename once complete); the
kernels it supports are its modules/<rel>/manifest.json files; the active version is where
/opt/nvidia/current points. state.json (written atomically) records the previous active version
(for rollback) and what nodeprep created outside /opt/nvidia (firmware links, the entry points of
entrypoints.py), so `remove` deletes
only its own files. load_state() reconciles the two, so a run killed between a rename and the
state write loses nothing.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..artifact import MANIFEST
from ..errors import StateError
from ..vocab import DRIVER_VERSION_RE
from .fsutil import atomic_write
from .layout import Layout

log = logging.getLogger(__name__)

STATE_FORMAT = 1


@dataclass(frozen=True)
class Installed:
    version: str
    kernels: tuple[str, ...] = ()
    input_digest: str = ""
    kmod_digests: dict[str, str] = field(default_factory=dict)
    firmware_link: str | None = None  # node path of the link nodeprep created, if any
    installed_at: float = 0.0


@dataclass(frozen=True)
class State:
    installed: dict[str, Installed] = field(default_factory=dict)
    active: str | None = None
    previous: str | None = None
    kernel_hook: dict[str, Any] | None = None  # what the kernel hook needs (kernelhook.HookConfig)
    entry_points: tuple[str, ...] = ()  # node paths of the links entrypoints.py made

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "active": self.active,
            "previous": self.previous,
            "kernel_hook": self.kernel_hook,
            "entry_points": list(self.entry_points),
            "installed": {
                v: {**asdict(i), "kernels": list(i.kernels)}
                for v, i in sorted(self.installed.items(), key=lambda kv: version_key(kv[0]))
            },
        }


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split(".") if x.isdigit())


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except ValueError as e:
        raise StateError(
            f"{path}: corrupt state file ({e})",
            hint="it is rewritten atomically, so this was edited by hand; fix or delete it",
        ) from None
    return data if isinstance(data, dict) else {}


def _digest(manifest: Path) -> str:
    try:
        return str(json.loads(manifest.read_text()).get("input_digest", ""))
    except (OSError, ValueError):
        return ""


def scan(layout: Layout) -> dict[str, Installed]:
    """Complete versions found under /opt/nvidia (ignores temporaries and foreign directories)."""
    found: dict[str, Installed] = {}
    if not layout.opt.is_dir():
        return found
    for d in sorted(layout.opt.iterdir()):
        if d.is_symlink() or not d.is_dir() or not DRIVER_VERSION_RE.fullmatch(d.name):
            continue
        if not (d / MANIFEST).is_file():
            continue
        kernels: dict[str, str] = {}
        mods = d / "modules"
        if mods.is_dir():
            for k in sorted(mods.iterdir()):
                if not k.name.startswith(".") and (k / MANIFEST).is_file():
                    kernels[k.name] = _digest(k / MANIFEST)
        found[d.name] = Installed(
            version=d.name,
            kernels=tuple(sorted(kernels)),
            input_digest=_digest(d / MANIFEST),
            kmod_digests=kernels,
        )
    return found


def active_version(layout: Layout) -> str | None:
    try:
        target = os.readlink(layout.current)
    except OSError:
        return None
    name = Path(target).name
    return name if DRIVER_VERSION_RE.fullmatch(name) and (layout.opt / name / MANIFEST).is_file() else None


def load_state(root: Path) -> State:
    """The node's state: installed versions (with kernels), active, previous."""
    layout = Layout(Path(root))
    recorded = _read_json(layout.state_file)
    rec_installed = recorded.get("installed", {}) if isinstance(recorded.get("installed"), dict) else {}
    installed: dict[str, Installed] = {}
    for version, found in scan(layout).items():
        rec = rec_installed.get(version) or {}
        installed[version] = replace(
            found, firmware_link=rec.get("firmware_link"), installed_at=float(rec.get("installed_at") or 0.0)
        )
    active = active_version(layout)
    previous = recorded.get("previous")
    if previous not in installed or previous == active:
        previous = None
    hook = recorded.get("kernel_hook")
    return State(installed=installed, active=active, previous=previous,
                 kernel_hook=hook if isinstance(hook, dict) else None,
                 entry_points=_entry_points(recorded.get("entry_points")))


def _entry_points(value: object) -> tuple[str, ...]:
    """The recorded entry points: absolute /usr paths without `..` (anything else is not nodeprep's)."""
    if not isinstance(value, list):
        return ()
    return tuple(sorted({p for p in value if isinstance(p, str) and p.startswith("/usr/")
                         and ".." not in p.split("/") and "\0" not in p}))


def save_state(layout: Layout, state: State, *, point: str | None = None) -> bool:
    data = json.dumps(state.to_dict(), indent=2, sort_keys=True) + "\n"
    return atomic_write(layout.state_file, data, point=point)


def now() -> float:
    return round(time.time(), 3)
