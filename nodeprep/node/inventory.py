"""What `nodeprep list` shows: every installed driver version with its kernels and their module
flavour, its size on disk and install time, plus the facts `nodeprep doctor` works from (active and
previous version, the kernel hook's record, the loaded module, the GPUs, the driver-root files).
Read-only; the manifests under the root are read bounded and a bad one is reported, not trusted."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..artifact import Manifest
from ..errors import NodeprepError
from ..safetar import MANIFEST
from ..sysfs import read_bytes
from ..vocab import version_key
from .doctor import gpus_present, loaded_version
from .layout import Layout
from .state import State, load_state

MANIFEST_LIMIT = 16 * 1024 * 1024  # a driver manifest lists a few thousand files


@dataclass(frozen=True)
class KernelModules:
    kernel: str
    flavour: str | None  # proprietary | open; None when the manifest could not be read
    problem: str | None = None


@dataclass(frozen=True)
class VersionInfo:
    version: str
    path: str  # node path, /opt/nvidia/<version>
    kernels: tuple[KernelModules, ...]
    size_bytes: int
    installed_at: float  # seconds since the epoch; 0.0 when nodeprep did not record it
    arch: str | None
    input_digest: str
    kmod_digests: dict[str, str]
    firmware_link: str | None

    @property
    def flavours(self) -> tuple[str, ...]:
        return tuple(sorted({k.flavour for k in self.kernels if k.flavour}))

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "path": self.path,
            "kernels": [k.kernel for k in self.kernels],
            "modules": {k.kernel: {"flavour": k.flavour, **({"problem": k.problem} if k.problem else {})}
                        for k in self.kernels},
            "flavours": list(self.flavours),
            "size_bytes": self.size_bytes,
            "installed_at": iso_time(self.installed_at),
            "arch": self.arch,
            "input_digest": self.input_digest,
            "kmod_digests": self.kmod_digests,
            "firmware_link": self.firmware_link,
        }


def iso_time(seconds: float) -> str | None:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if seconds > 0 else None


def tree_size(top: Path) -> int:
    """Bytes of the regular files under `top`; links are not followed (a root is hostile input)."""
    total = 0
    for dirpath, _, filenames in os.walk(top):
        for name in filenames:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if not os.path.islink(os.path.join(dirpath, name)):
                total += st.st_size
    return total


def _manifest(path: Path) -> tuple[Manifest | None, str | None]:
    try:
        return Manifest.from_json(read_bytes(path, limit=MANIFEST_LIMIT), source=str(path)), None
    except (NodeprepError, OSError, ValueError) as e:
        return None, str(e)


def kmod_flavour(root: Path, version: str, kernel: str) -> str | None:
    """The module flavour of an installed version's modules for `kernel` (None: unreadable)."""
    kmod, _ = _manifest(Layout(Path(root)).kmod_dir(version, kernel) / MANIFEST)
    return kmod.flavour if kmod else None


def version_info(layout: Layout, state: State, version: str) -> VersionInfo:
    top = layout.version_dir(version)
    user, _ = _manifest(top / MANIFEST)
    kernels = []
    for kernel in state.installed[version].kernels:
        kmod, problem = _manifest(top / "modules" / kernel / MANIFEST)
        kernels.append(KernelModules(kernel, kmod.flavour if kmod else None, problem))
    return VersionInfo(
        version=version,
        path=f"/opt/nvidia/{version}",
        kernels=tuple(kernels),
        size_bytes=tree_size(top),
        installed_at=state.installed[version].installed_at,
        arch=user.arch if user else None,
        input_digest=state.installed[version].input_digest,
        kmod_digests=dict(state.installed[version].kmod_digests),
        firmware_link=state.installed[version].firmware_link,
    )


def inventory(root: Path) -> dict[str, Any]:
    """The `list --json` document."""
    layout = Layout(Path(root))
    state = load_state(layout.root)
    versions = [version_info(layout, state, v) for v in sorted(state.installed, key=version_key)]
    return {
        "active": state.active,
        "previous": state.previous,
        "installed": {v.version: v.to_dict() for v in versions},
        "kernel_hook": state.kernel_hook,
        "loaded_module": loaded_version(layout.root),
        "gpus": gpus_present(layout.root),
        "files": {
            "state": "/var/lib/nodeprep/state.json",
            "ld_conf": _present(layout, layout.ld_conf),
            "modprobe_conf": _present(layout, layout.modprobe_conf),
            "unit": _present(layout, layout.unit),
        },
    }


def _present(layout: Layout, path: Path) -> str | None:
    """The node path of `path` when it exists, else None."""
    return "/" + str(path.relative_to(layout.root)) if path.is_file() else None


def render(doc: dict[str, Any]) -> list[str]:
    """The text lines of `nodeprep list`: one per version (* active, < previous)."""
    lines = []
    for v, info in doc["installed"].items():
        mark = "*" if v == doc["active"] else ("<" if v == doc["previous"] else " ")
        kernels = ", ".join(
            f"{k} ({m['flavour'] or 'unreadable manifest'})" for k, m in info["modules"].items()
        ) or "no kernel modules"
        when = info["installed_at"] or "install time not recorded"
        size = f"{info['size_bytes'] / 2**20:.1f} MiB"
        lines.append(f"{mark} {v}  {size}  installed {when}  kernels: {kernels}")
    return lines

