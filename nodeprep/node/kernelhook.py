"""A new kernel never boots without its driver: Debian kernel hooks (/etc/kernel/postinst.d and
postrm.d) that `install` writes, and what they run (`nodeprep kernel-hook postinst|postrm KERNEL`).

`install` records in state.json (`kernel_hook`) where the driver came from (store, arch, store
options) and whether to keep the boot default; the active version and its flavour are read from the
filesystem when the hook runs. On a kernel package's postinst the hook installs the active version's
kmod for that kernel through `installer.install`, exactly as `nodeprep install --kernel` would. When that
fails (no artifact, store gone) it says so in one line and, with `keep_boot_kernel`, writes a GRUB
drop-in that keeps the boot default on a kernel that has the driver. The hook script itself always
exits 0: a failing postinst.d hook leaves the kernel package half-configured and apt broken.
On postrm it deletes nodeprep's modules and links for a kernel that is gone.
This module records and writes the hooks (installer.install calls it); what they run is kernelevents.py.
"""

from __future__ import annotations

import logging
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import download
from ..atomicfile import atomic_write
from ..stores import is_oci
from ..sysfs import read_bytes
from .layout import Layout

log = logging.getLogger(__name__)

HOOK_NAME = "nodeprep"  # runs after dkms and initramfs-tools, before zz-update-grub (run-parts order)
EVENTS = ("postinst", "postrm")
HOLD_FILE = "etc/default/grub.d/zz-nodeprep-keep-kernel.cfg"  # sourced by Debian's grub-mkconfig
LOUD = "nodeprep kernel hook: NO NVIDIA DRIVER FOR KERNEL"


@dataclass(frozen=True)
class KernelHookConfig:
    """What the hook needs besides the filesystem; node paths (as the node sees them)."""

    store: str
    arch: str = "amd64"
    registry_auth: str | None = None
    ca_file: str | None = None
    insecure_http: bool = False
    keep_boot_kernel: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: Any) -> KernelHookConfig | None:
        if not isinstance(data, dict) or not isinstance(data.get("store"), str):
            return None
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


# --- recording (at install time) -------------------------------------------------------------


def node_view(layout: Layout, location: str | None) -> str | None:
    """A store or file as the node will see it: a local path under ROOT loses the ROOT prefix."""
    if not location or is_oci(location) or (local := download.local_path(location)) is None:
        return location
    try:
        return "/" + Path(os.path.abspath(local)).relative_to(os.path.abspath(layout.root)).as_posix()
    except ValueError:
        return location


def node_store(layout: Layout, store: str, given: str | None) -> str | None:
    """The store to record for the kernel hook: `given` (--node-store: what the booted node will
    reach), else `store` as the node sees it; None when that is a directory of the machine running
    nodeprep and not of the image under ROOT (a relative path, or one outside ROOT), which the
    booted node would not have."""
    if given:
        return given
    seen = node_view(layout, store)
    if layout.live or seen is None or is_oci(seen) or download.local_path(seen) is None:
        return seen
    return seen if seen.startswith("/") and local_inside(layout, store) else None


def local_inside(layout: Layout, location: str) -> bool:
    local = download.local_path(location)
    return local is not None and Path(os.path.abspath(local)).is_relative_to(os.path.abspath(layout.root))


def unrecorded_note(store: str) -> str:
    return (f"kernel hook: the store {store} is a directory of this machine, not of the image, so it is not "
            "recorded; give --node-store with the store the booted node will reach (docs/node.md, "
            "\"Kernel updates\")")


def keep_record(active: str | None, recorded: dict[str, Any] | None, version: str, activate: bool) -> bool:
    """True when installing `version` must leave the recorded store alone: another version is active
    and stays so, and its kernel modules come from the store already recorded, not from this one."""
    return recorded is not None and active not in (None, version) and not activate


def hook_path(layout: Layout, event: str) -> Path:
    return layout.resolved(f"/etc/kernel/{event}.d") / HOOK_NAME


def render_hook(command: str, event: str) -> str:
    """The hook script: calls nodeprep and always exits 0 (docs/node.md, "Kernel updates")."""
    exe = shlex.split(command)[0]
    if event == "postinst":
        what = "installed, install the active NVIDIA driver's modules for it from the store"
        missing = f"{LOUD} $1: {exe} is not installed"
    else:
        what = "removed, delete nodeprep's NVIDIA modules for it"
        missing = f"nodeprep kernel hook: kernel $1: {exe} is not installed"
    return f"""\
#!/bin/sh
# Written by nodeprep (nodeprep install): when a kernel package is {what}.
# Arguments: kernel release, image path (Debian kernel handbook, 8.1). Never fails the kernel
# package: a missing driver is one line on stderr, never a half-configured package.
exec </dev/null >&2
PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH"
case " ${{DEB_MAINT_PARAMS:-}} " in *abort*) exit 0 ;; esac
[ -n "${{1:-}}" ] || exit 0
if command -v {shlex.quote(exe)} >/dev/null 2>&1; then
    {command} kernel-hook {event} "$@" || true
else
    echo "{missing}"
fi
exit 0
"""


def _differs(path: Path, text: str) -> bool:
    try:
        return read_bytes(path, limit=1 << 20).decode() != text or (path.stat().st_mode & 0o7777) != 0o755
    except (OSError, UnicodeDecodeError):
        return True


def drift(layout: Layout, command: str) -> tuple[str, ...]:
    """Node paths of the hook scripts that are missing or differ from what write_hooks writes."""
    return tuple(layout.node_path(hook_path(layout, e)) for e in EVENTS
                 if _differs(hook_path(layout, e), render_hook(command, e)))


def write_hooks(layout: Layout, command: str) -> bool:
    changed = False
    for event in EVENTS:
        changed |= atomic_write(hook_path(layout, event), render_hook(command, event), mode=0o755)
    return changed
