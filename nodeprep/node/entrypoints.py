"""Stable entry points: the active driver where NVIDIA's own discovery looks for a host driver.

The GPU Operator's validator looks for `nvidia-smi` in /usr/bin, /usr/sbin, /bin, /sbin of the host
root and runs it there; its driver-root lookup (gpu-operator internal/driver/root.go, the DRA kubelet
plugin's root.go likewise) and nvidia-ctk's (nvidia-container-toolkit internal/lookup) find
`libnvidia-ml.so.1` in /usr/lib64, /usr/lib/<triplet>, /lib64, /lib/<triplet> and take its folder
for the other libraries, and the tools nvidia-smi, nvidia-debugdump, nvidia-persistenced,
nvidia-cuda-mps-control/-server, nvidia-imex(-ctl) on the standard paths. /opt/nvidia/current is
none of those, so activation adds symlinks there that go *through* `current`:

    /usr/bin/nvidia-smi -> ../../opt/nvidia/current/bin/nvidia-smi
    /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 -> ../../../opt/nvidia/current/lib64/libnvidia-ml.so.1

Relative, so they resolve inside --root as on the booted node; through `current`, so they move with
its one atomic rename on activate, switch and rollback and need no rewrite. Only names the version
ships get a link. A path another package owns (dpkg's lists under the root) or any file nodeprep did
not make is never replaced: activation is refused before anything changes. The links are recorded
in state.json (State.entry_points) and removed when no version is active any more.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from ..atomicfile import atomic_symlink
from . import imagefile
from .layout import Layout

TOOLS = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-imex",
    "nvidia-imex-ctl",
)
LIBRARIES = ("libnvidia-ml.so.1", "libcuda.so.1")
TRIPLETS = {"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}
DPKG_INFO_NODE = "/var/lib/dpkg/info"


def _arch(vdir: Path) -> str:
    """The version's architecture from its manifest (read as the image's file: no link followed,
    bounded), amd64 when it says none."""
    try:
        raw = imagefile.read(vdir / "manifest.json", limit=16 << 20, what="driver manifest")
        data = json.loads(raw or b"{}")
    except ValueError:
        return "amd64"
    arch = data.get("arch") if isinstance(data, dict) else None
    return arch if arch in TRIPLETS else "amd64"


def library_dir(layout: Layout, arch: str) -> str:
    """The node path of the library folder for `arch`: /usr/lib/<triplet>, or /usr/lib64 on a root
    that has only that (both are in the validator's and the toolkit's lists)."""
    multiarch = f"/usr/lib/{TRIPLETS[arch]}"
    if not layout.host_path(multiarch).is_dir() and layout.host_path("/usr/lib64").is_dir():
        return "/usr/lib64"
    return multiarch


def planned(layout: Layout, version: str) -> dict[str, str]:
    """Node path of each entry point `version` needs -> the path below /opt/nvidia/current it names."""
    vdir = layout.version_dir(version)
    libdir = library_dir(layout, _arch(vdir))
    out = {f"/usr/bin/{t}": f"bin/{t}" for t in TOOLS if (vdir / "bin" / t).is_file()}
    out.update({f"{libdir}/{lib}": f"lib64/{lib}" for lib in LIBRARIES if (vdir / "lib64" / lib).exists()})
    return out


def required(layout: Layout, arch: str) -> dict[str, str]:
    """The entry points every installable version has (complete.py requires nvidia-smi, libcuda.so.1 and
    libnvidia-ml.so.1), known before its artifact is read: what `install --activate` checks first."""
    libdir = library_dir(layout, arch if arch in TRIPLETS else "amd64")
    return {"/usr/bin/nvidia-smi": "bin/nvidia-smi",
            **{f"{libdir}/{lib}": f"lib64/{lib}" for lib in LIBRARIES}}


def link_text(layout: Layout, node_path: str, below_current: str) -> str:
    """Relative link text from the entry point's real folder to /opt/nvidia/current/<below_current>
    (the text of `current`, never its resolved version)."""
    folder = os.path.realpath(layout.host_path(node_path).parent)
    return f"{os.path.relpath(os.path.realpath(layout.opt), folder)}/current/{below_current}"


def _aliases(node_path: str) -> set[str]:
    """The spellings of a path on a merged-/usr system (/bin/x and /usr/bin/x are one file)."""
    bare = node_path.removeprefix("/usr")
    return {node_path, bare, f"/usr{bare}"}


def drift(layout: Layout, version: str, arch: str) -> tuple[str, ...]:
    """Node paths of the entry points an activation of `version` would make or repoint (for the
    plan; required() when `version` is not installed yet)."""
    vdir = layout.version_dir(version)
    paths = planned(layout, version) if vdir.is_dir() else required(layout, arch)
    out = []
    for node_path, below in paths.items():
        path = layout.host_path(node_path)
        if not (path.is_symlink() and os.readlink(path) == link_text(layout, node_path, below)):
            out.append(node_path)
    return tuple(out)


def dpkg_owner(layout: Layout, node_path: str) -> str | None:
    """The dpkg package whose file list under the root names `node_path` (None: none does). The
    lists are the image's: /var/lib/dpkg/info resolved beneath the root, each `*.list` read only
    when a regular file (a FIFO, device or link there: InputError naming it, imagefile.read)."""
    info = layout.resolved(DPKG_INFO_NODE)
    if not info.is_dir():
        return None
    wanted = _aliases(node_path)
    for name in sorted(os.listdir(info)):
        if not name.endswith(".list"):
            continue
        raw = imagefile.read(info / name, limit=imagefile.MAX_LIST, what="a dpkg file list")
        if raw is not None and any(line in wanted for line in raw.decode(errors="replace").split("\n")):
            return name.removesuffix(".list").split(":")[0]
    return None


def refusal(layout: Layout, version: str, recorded: Iterable[str],
            paths: dict[str, str] | None = None) -> str | None:
    """Why the entry points of `version` (or `paths`, from required()) cannot be made (one line), or
    None. A path is free when it is absent or is a link nodeprep made (recorded, or naming
    /opt/nvidia/current as nodeprep does)."""
    ours = set(recorded)
    for node_path, below in (planned(layout, version) if paths is None else paths).items():
        owner = dpkg_owner(layout, node_path)
        if owner:
            return (f"{node_path} belongs to package {owner} (dpkg): nodeprep does not replace another "
                    f"package's file; {version} not activated")
        path = layout.host_path(node_path)
        if not os.path.lexists(path):
            continue
        if path.is_symlink() and (node_path in ours or os.readlink(path) == link_text(layout, node_path,
                                                                                       below)):
            continue
        return (f"{node_path} exists and nodeprep did not make it (a driver installed another way?); "
                f"move it away to let nodeprep link the active driver there; {version} not activated")
    return None


def link(layout: Layout, version: str) -> bool:
    """Create or repoint the entry points of `version` (atomic symlink renames); True if any changed.
    Call only after refusal() said None."""
    changed = False
    for node_path, below in planned(layout, version).items():
        path = layout.host_path(node_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        changed |= atomic_symlink(path, link_text(layout, node_path, below), point="activate:entry-point")
    return changed


def unlink(layout: Layout, node_paths: Iterable[str]) -> list[str]:
    """Remove those of `node_paths` that are still symlinks into /opt/nvidia/current (what nodeprep
    made); a file put there since is left alone. Returns the node paths removed."""
    removed = []
    for node_path in sorted(node_paths):
        path = layout.host_path(node_path)
        if path.is_symlink() and "/current/" in os.readlink(path):
            path.unlink()
            removed.append(node_path)
    return removed
