"""Host facts: OS release, kernel, and the driver nodeprep installed (read defensively: the install
area owns /var/lib/nodeprep/state.json and may change its shape).

The kernel of a root other than / is the root's target kernel, never the kernel this process runs
on (see `root_kernel`). Every path under a root is resolved beneath it (nodeprep.rootpath.beneath),
so the image's links never lead to the host's files."""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..rootpath import beneath
from ..sysfs import read_attr
from ..vocab import DRIVER_VERSION_RE

log = logging.getLogger(__name__)

STATE_FILE = "var/lib/nodeprep/state.json"
MIG_STATE_FILE = "var/lib/nodeprep/mig.json"  # written by nodeprep.node.migapply (`nodeprep mig`)
MIG_STATES = ("success", "pending", "failed")  # mig-manager's nvidia.com/mig.config.state values
MIG_CONFIG_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
CURRENT_LINK = "opt/nvidia/current"
STATE_MAX = 4 << 20  # state.json and manifests: nodeprep's own files, far below this


@dataclass(frozen=True)
class SystemFacts:
    os_id: str | None = None
    os_version: str | None = None
    kernel: str | None = None
    driver_version: str | None = None  # nodeprep's active driver
    flavour: str | None = None
    artifact_digest: str | None = None
    # The kmod artifact actually installed: for `kernel` when the active driver has modules for it,
    # else its newest one (a node booted into a kernel without modules shows both kernels).
    artifact_kernel: str | None = None
    artifact_os: str | None = None  # nodeprep's target OS of that artifact (e.g. debian-13)
    mig_config: str | None = None  # the mig-config `nodeprep mig` last put in place (or tried to)
    mig_config_state: str | None = None  # its outcome: success, pending or failed


def os_release(root: Path, problems: list[str] | None = None) -> dict[str, str]:
    for rel in ("etc/os-release", "usr/lib/os-release"):
        # etc/os-release is usually a symlink to ../usr/lib/os-release: follow it (beneath the root),
        # but read only a small regular file (never block on a FIFO)
        text = read_attr(beneath(root, rel), problems, follow=True, errors="replace")
        if text is None:
            continue
        out = {}
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() and not key.startswith("#"):
                out[key.strip()] = value.strip().strip("'\"")
        return out
    return {}


def _json(path: Path) -> dict[str, Any]:
    text = read_attr(path, follow=True, limit=STATE_MAX)
    try:
        data = json.loads(text) if text is not None else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _first_str(data: dict[str, Any], *keys: str) -> str | None:
    for key in keys:
        value = data.get(key)
        if isinstance(value, str) and value:
            return value
    return None


@dataclass(frozen=True)
class InstalledDriver:
    version: str | None = None
    flavour: str | None = None
    digest: str | None = None
    artifact_kernel: str | None = None
    artifact_os: str | None = None


def installed_driver(root: Path, kernel: str | None) -> InstalledDriver:
    """nodeprep's active driver under `root` and the artifact installed for `kernel`."""
    # The filesystem is the truth (nodeprep/node/state.py): /opt/nvidia/current names the active
    # version; state.json is only consulted when the link is missing.
    state = _json(beneath(root, STATE_FILE))
    version = flavour = digest = None
    link = beneath(root, CURRENT_LINK, follow_last=False)
    if link.is_symlink():
        version = os.path.basename(os.readlink(link).rstrip("/")) or None
    active = state.get("active")
    if isinstance(active, dict):
        version = version or _first_str(active, "driver_version", "version", "driver")
        flavour = _first_str(active, "flavour", "flavor")
        digest = _first_str(active, "artifact_digest", "input_digest", "digest")
    elif isinstance(active, str) and active:
        version = version or active
    version = version or _first_str(state, "active_version", "current", "driver_version")
    flavour = flavour or _first_str(state, "flavour", "flavor")
    if not version or not DRIVER_VERSION_RE.fullmatch(version):  # a name from the image: never a path
        return InstalledDriver(None, flavour, digest)
    base = f"opt/nvidia/{version}"
    kmod = _json(beneath(root, f"{base}/modules/{kernel}/manifest.json")) if kernel else {}
    user = _json(beneath(root, f"{base}/manifest.json"))
    flavour = flavour or _first_str(kmod, "flavour")
    digest = digest or _first_str(kmod, "input_digest") or _first_str(user, "input_digest")
    built_for = kernel if kmod else newest_release(module_kernels(root, base))
    artifact = kmod or (_json(beneath(root, f"{base}/modules/{built_for}/manifest.json"))
                        if built_for else {})
    return InstalledDriver(version, flavour, digest, _first_str(artifact, "kernel_release") or built_for,
                           _first_str(artifact, "os") or _first_str(user, "os"))


def module_kernels(root: Path, base: str) -> list[str]:
    """Kernels the driver root `base` (as the node names it) under `root` has modules for: its
    modules/<release>/manifest.json files (what nodeprep.node.state counts as installed)."""
    try:
        names = [d.name for d in beneath(root, f"{base}/modules").iterdir()]
    except OSError:
        return []
    return [n for n in names if beneath(root, f"{base}/modules/{n}/manifest.json").is_file()]


def _release_key(release: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key for kernel releases: numbers compare as numbers (6.1.0-28 < 6.1.0-101)."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", release) if p)


def newest_release(releases: list[str]) -> str | None:
    return max(releases, key=_release_key) if releases else None


def root_kernel(root: Path) -> str | None:
    """The kernel a root (an image, a chroot) will boot, for its labels: the newest kernel the
    active driver has modules for (/opt/nvidia/current/modules/<release>), else the newest
    /lib/modules/<release> with a kernel in it (its modules.order or kernel/ directory), else None.
    Never the kernel of the machine running nodeprep."""
    def names(rel: str) -> list[str]:
        try:
            return [d.name for d in beneath(root, rel).iterdir()]
        except OSError:
            return []

    kmods = f"{CURRENT_LINK}/modules"
    with_driver = [n for n in names(kmods) if beneath(root, f"{kmods}/{n}").is_dir()]
    if with_driver:
        return newest_release(with_driver)
    installed = [n for n in names("lib/modules") if beneath(root, f"lib/modules/{n}/modules.order").is_file()
                 or beneath(root, f"lib/modules/{n}/kernel").is_dir()]
    return newest_release(installed)


def is_live(root: Path) -> bool:
    return Path(root).resolve() == Path("/")


def system_facts(root: Path, kernel: str | None = None, problems: list[str] | None = None) -> SystemFacts:
    """Facts of `root`; the kernel is `kernel`, else the running one on /, else `root_kernel(root)`."""
    rel = os_release(root, problems)
    kernel = kernel or (os.uname().release if is_live(root) else root_kernel(root))
    d = installed_driver(root, kernel)
    mig = mig_state(root)
    return SystemFacts(rel.get("ID"), rel.get("VERSION_ID"), kernel, d.version, d.flavour, d.digest,
                       d.artifact_kernel, d.artifact_os, *mig)


def mig_state(root: Path) -> tuple[str | None, str | None]:
    """(config, state) from ROOT/var/lib/nodeprep/mig.json; (None, None) when absent or not as
    `nodeprep mig` writes it (a name that is not a label value, an unknown state)."""
    data = _json(beneath(root, MIG_STATE_FILE))
    config, state = data.get("config"), data.get("state")
    if not isinstance(config, str) or not MIG_CONFIG_RE.fullmatch(config) or state not in MIG_STATES:
        return None, None
    return config, state
