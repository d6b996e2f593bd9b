"""Where nodeprep puts things on a node, all relative to `root` (`--root`, default /).

/opt/nvidia/<driver>/{lib64,bin,firmware,modules/<kernel-release>}, manifest.json
/opt/nvidia/current -> <driver>
/etc/ld.so.conf.d/00-nvidia.conf
/etc/modprobe.d/nodeprep-nvidia.conf
/etc/systemd/system/nodeprep-nvidia.service (+ multi-user.target.wants link)
/etc/systemd/system/nodeprep-persistenced.service (+ multi-user.target.wants link)
/etc/systemd/system/nodeprep-fabricmanager.service (+ multi-user.target.wants link)
/lib/modules/<kernel-release>/updates/nodeprep/<module>.ko -> /opt/nvidia/current/modules/<rel>/<module>.ko
/lib/firmware/nvidia/<driver> -> /opt/nvidia/<driver>/firmware/nvidia/<driver>
/var/lib/nodeprep/{state.json,lock}

Under a --root every path is resolved beneath it (rootpath.beneath: openat2 RESOLVE_IN_ROOT), so an
image's links, absolute ones included, lead where they lead on the booted node and never out of the
root: a directory is resolved whole, a file's or link's last component is left as named (nodeprep
replaces it by rename, never writes through it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..profile.fields import field_error
from ..rootpath import beneath
from ..vocab import DRIVER_VERSION_RE, KERNEL_RELEASE_RE

UNIT_NAME = "nodeprep-nvidia.service"
PERSISTENCED_UNIT_NAME = "nodeprep-persistenced.service"
FABRICMANAGER_UNIT_NAME = "nodeprep-fabricmanager.service"
LD_CONF_NAME = "00-nvidia.conf"
MODPROBE_CONF_NAME = "nodeprep-nvidia.conf"
MODULE_SUBDIR = "updates/nodeprep"
TEMP_PREFIXES = (".staging-", ".current-", ".removing-", ".tmp-")


def check_version(version: str) -> str:
    if not DRIVER_VERSION_RE.fullmatch(version):
        raise field_error("driver.version", f"{version!r} is not a driver version (e.g. 535.309.01)")
    return version


def check_kernel(release: str) -> str:
    if not KERNEL_RELEASE_RE.fullmatch(release):
        raise field_error("driver.kernel", f"{release!r} is not a kernel release (e.g. 6.1.0-28-amd64)")
    return release


@dataclass(frozen=True)
class Layout:
    root: Path

    @property
    def live(self) -> bool:
        """True when operating on the running system (root is /)."""
        return self.root.resolve() == Path("/")

    @property
    def opt(self) -> Path:
        return self.resolved("/opt/nvidia")

    def version_dir(self, version: str) -> Path:
        return self.opt / check_version(version)

    def kmod_dir(self, version: str, kernel: str) -> Path:
        return self.version_dir(version) / "modules" / check_kernel(kernel)

    @property
    def current(self) -> Path:
        return self.opt / "current"

    @property
    def ld_conf(self) -> Path:
        return self.resolved("/etc/ld.so.conf.d") / LD_CONF_NAME

    @property
    def ld_cache(self) -> Path:
        """Only read (ldconfig -p -C): a link in its place is resolved beneath ROOT too."""
        return self.resolved("/etc/ld.so.cache")

    @property
    def modprobe_conf(self) -> Path:
        return self.resolved("/etc/modprobe.d") / MODPROBE_CONF_NAME

    @property
    def unit(self) -> Path:
        return self.resolved("/etc/systemd/system") / UNIT_NAME

    @property
    def unit_wants(self) -> Path:
        return self.resolved("/etc/systemd/system/multi-user.target.wants") / UNIT_NAME

    @property
    def persistenced_unit(self) -> Path:
        return self.resolved("/etc/systemd/system") / PERSISTENCED_UNIT_NAME

    @property
    def persistenced_wants(self) -> Path:
        return self.resolved("/etc/systemd/system/multi-user.target.wants") / PERSISTENCED_UNIT_NAME

    @property
    def fabricmanager_unit(self) -> Path:
        return self.resolved("/etc/systemd/system") / FABRICMANAGER_UNIT_NAME

    @property
    def fabricmanager_wants(self) -> Path:
        return self.resolved("/etc/systemd/system/multi-user.target.wants") / FABRICMANAGER_UNIT_NAME

    def module_links(self, kernel: str) -> Path:
        return self.resolved(f"/lib/modules/{check_kernel(kernel)}/{MODULE_SUBDIR}")

    def firmware_link(self, version: str) -> Path:
        return self.resolved("/lib/firmware/nvidia") / check_version(version)

    @property
    def state_dir(self) -> Path:
        return self.resolved("/var/lib/nodeprep")

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def lock_file(self) -> Path:
        return self.state_dir / "lock"

    @property
    def download_dir(self) -> Path:
        return self.resolved("/var/cache/nodeprep")

    def host_path(self, path: str) -> Path:
        """Where the node's absolute `path` is under ROOT (`/opt/x` -> ROOT/opt/x), resolved beneath
        it; a link in the last component is left as named."""
        return beneath(self.root, path, follow_last=False)

    def resolved(self, path: str) -> Path:
        """Where the node's `path` is under ROOT, every link on it (the last one too) resolved beneath
        ROOT: for directories, and for files that are only read."""
        return beneath(self.root, path)

    def node_path(self, path: Path) -> str:
        """Inverse of host_path: the absolute path the node sees for `path` under ROOT."""
        return "/" + path.relative_to(self.root).as_posix()
