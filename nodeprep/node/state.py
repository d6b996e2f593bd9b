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
import math
import os
import stat
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..atomicfile import atomic_write
from ..errors import StateFileError
from ..safetar import MANIFEST
from ..sysfs import read_bytes
from ..vocab import DRIVER_VERSION_RE, KERNEL_RELEASE_RE, version_key
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
    kernel_hook: dict[str, Any] | None = None  # what the kernel hook needs (kernelhook.KernelHookConfig)
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


STATE_HINT = "it is rewritten atomically, so this was edited by hand; fix or delete it"
STATE_MAX = 4 << 20  # far above what nodeprep writes


def _read_json(path: Path) -> dict[str, Any]:
    """state.json's document, every field checked by type (StateFileError naming the file and the
    field otherwise); {} when there is none."""
    try:  # a regular file, not a link (nodeprep writes it so), never a blocking open
        raw = read_bytes(path, limit=STATE_MAX)
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise StateFileError(f"{path}: cannot read the state file ({e.strerror or e})",
                             hint=STATE_HINT) from None
    try:
        data: dict[str, Any] = json.loads(raw.decode("utf-8"))  # an object: state_problem says otherwise
    except (ValueError, RecursionError) as e:
        raise StateFileError(f"{path}: corrupt state file ({str(e)[:200]})", hint=STATE_HINT) from None
    problem = state_problem(data)
    if problem:
        raise StateFileError(f"{path}: {problem}", hint=STATE_HINT)
    return data


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _node_path(value: Any, prefix: str) -> bool:
    """An absolute node path under `prefix` without `.`/`..`/empty components or a NUL."""
    return (isinstance(value, str) and value.startswith(prefix) and "\0" not in value
            and all(c not in ("", ".", "..") for c in value[1:].split("/")))


def _version(value: Any) -> bool:
    return isinstance(value, str) and DRIVER_VERSION_RE.fullmatch(value) is not None


# kernel_hook's fields (kernelhook.KernelHookConfig) -> the types they take
HOOK_FIELDS: dict[str, tuple[type, ...]] = {
    "store": (str,), "arch": (str,), "registry_auth": (str, type(None)), "ca_file": (str, type(None)),
    "insecure_http": (bool,), "keep_boot_kernel": (bool,),
}


def state_problem(data: Any) -> str | None:
    """The first field of a state.json document that is not what save_state writes, named by its
    path (`installed.'535.309.01'.installed_at: ...`), or None. Pure."""
    if not isinstance(data, dict):
        return f"expected a JSON object, got {_shown(data)}"
    if data.get("format", STATE_FORMAT) != STATE_FORMAT or isinstance(data.get("format"), bool):
        return f"format: {_shown(data.get('format'))} is not {STATE_FORMAT}"
    for key in ("active", "previous"):
        if data.get(key) is not None and not _version(data[key]):
            return f"{key}: {_shown(data[key])} is not a driver version"
    hook = data.get("kernel_hook")
    if hook is not None:
        if not isinstance(hook, dict):
            return f"kernel_hook: expected an object or null, got {_shown(hook)}"
        for key, kinds in HOOK_FIELDS.items():
            if key in hook and not isinstance(hook[key], kinds):
                return f"kernel_hook.{key}: wrong type {_shown(hook[key])}"
    points = data.get("entry_points", [])
    if not isinstance(points, list):
        return f"entry_points: expected a list, got {_shown(points)}"
    for i, p in enumerate(points):
        if not _node_path(p, "/usr/"):
            return f"entry_points[{i}]: {_shown(p)} is not a path under /usr"
    installed = data.get("installed", {})
    if not isinstance(installed, dict):
        return f"installed: expected an object, got {_shown(installed)}"
    for version, rec in installed.items():
        where = f"installed.{_shown(version)}"
        if not _version(version):
            return f"{where}: not a driver version"
        problem = _installed_problem(version, rec)
        if problem:
            return f"{where}{problem}"
    return None


def _installed_problem(version: str, rec: Any) -> str | None:
    if not isinstance(rec, dict):
        return f": expected an object, got {_shown(rec)}"
    if rec.get("version", version) != version:
        return f".version: {_shown(rec.get('version'))} is not {version}"
    kernels = rec.get("kernels", [])
    if not isinstance(kernels, list) or not all(
            isinstance(k, str) and KERNEL_RELEASE_RE.fullmatch(k) for k in kernels):
        return f".kernels: expected a list of kernel releases, got {_shown(kernels)}"
    if not isinstance(rec.get("input_digest", ""), str):
        return f".input_digest: expected a string, got {_shown(rec['input_digest'])}"
    digests = rec.get("kmod_digests", {})
    if not isinstance(digests, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in digests.items()):
        return f".kmod_digests: expected an object of strings, got {_shown(digests)}"
    link = rec.get("firmware_link")
    if link is not None and not _node_path(link, "/"):  # /usr/lib/firmware/... in a usr-merged image
        return f".firmware_link: {_shown(link)} is not an absolute path"
    at = rec.get("installed_at", 0.0)
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at) or at < 0:
        return f".installed_at: expected a time in seconds, got {_shown(at)}"
    return None


MAX_MANIFEST = 16 << 20  # an installed root's manifest.json: a few hundred KB


def _is_manifest(path: Path) -> bool:
    """A regular file, not a link: an image's manifest.json linked to a host file is no manifest."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _digest(manifest: Path) -> str:
    """The manifest's input digest, read without following a link, bounded ("" when unreadable)."""
    try:
        data = json.loads(read_bytes(manifest, limit=MAX_MANIFEST))
    except (OSError, ValueError):
        return ""
    return str(data.get("input_digest", "")) if isinstance(data, dict) else ""


def scan(layout: Layout) -> dict[str, Installed]:
    """Complete versions found under /opt/nvidia (ignores temporaries and foreign directories)."""
    found: dict[str, Installed] = {}
    if not layout.opt.is_dir():
        return found
    for d in sorted(layout.opt.iterdir()):
        if d.is_symlink() or not d.is_dir() or not DRIVER_VERSION_RE.fullmatch(d.name):
            continue
        if not _is_manifest(d / MANIFEST):
            continue
        kernels: dict[str, str] = {}
        mods = d / "modules"
        if mods.is_dir():
            for k in sorted(mods.iterdir()):
                if not k.name.startswith(".") and _is_manifest(k / MANIFEST):
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
    return name if DRIVER_VERSION_RE.fullmatch(name) and _is_manifest(layout.opt / name / MANIFEST) else None


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
    """The recorded entry points (absolute /usr paths: state_problem refuses anything else)."""
    return tuple(sorted(set(value))) if isinstance(value, list) else ()


def save_state(layout: Layout, state: State, *, point: str | None = None) -> bool:
    data = json.dumps(state.to_dict(), indent=2, sort_keys=True) + "\n"
    return atomic_write(layout.state_file, data, point=point)


def now() -> float:
    return round(time.time(), 3)
