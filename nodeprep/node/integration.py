"""System integration of the active driver root: soname links, ld.so.conf.d + ldconfig, module
links + depmod, modprobe.d (nouveau blacklist), firmware links, the systemd unit. Each function is
idempotent and returns whether it changed anything."""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path

from .. import runner, sonames, sysfs
from ..atomicfile import atomic_symlink, atomic_write, fsync_dir, relative_target
from ..containerhooks.container import ldconfig_argv
from ..crash import crash_point
from ..errors import InputError
from ..profile.model import DEFAULT_DAEMONS, Daemons
from ..vocab import DEFAULT_MODULES, KERNEL_MODULES
from . import imagefile
from .layout import FABRICMANAGER_UNIT_NAME, PERSISTENCED_UNIT_NAME, UNIT_NAME, Layout

log = logging.getLogger(__name__)

LD_CONF = "/opt/nvidia/current/lib64\n"
MODPROBE_CONF = """\
# Written by nodeprep: the NVIDIA driver in /opt/nvidia/current replaces nouveau.
blacklist nouveau
options nouveau modeset=0
"""


def write_ld_conf(layout: Layout) -> bool:
    return atomic_write(layout.ld_conf, LD_CONF, point="activate:ld-conf-tmp")


def run_ldconfig(layout: Layout) -> None:
    """Rebuild ROOT/etc/ld.so.cache (ldconfig -r ROOT, or plain ldconfig on a live system). The
    host's ldconfig chroots itself into ROOT; a procfs mounted in ROOT (a chroot set up for a build)
    would still lead out of it through /proc/<pid>/root, so then it runs as the container hook runs
    it, PID 1 of a new PID namespace with a fresh /proc over ROOT/proc (a procfs elsewhere in ROOT
    is refused)."""
    if layout.live:
        runner.run(["ldconfig"], timeout=120)
        return
    mountinfo = sysfs.read_attr(Path("/proc/self/mountinfo"), limit=16 << 20) or ""
    procs = proc_mounts_beneath(layout.root, mountinfo)
    if not procs:
        runner.run(["ldconfig", "-r", layout.root], timeout=120)
        return
    if procs != [os.path.realpath(layout.root / "proc")]:
        raise InputError(f"{procs[-1]}: a procfs mounted inside --root {layout.root} (the host's processes' "
                         "roots are reachable through it); nothing was changed",
                         hint="unmount it, or mount /proc only at ROOT/proc")
    root = os.path.realpath(layout.root)
    runner.run(ldconfig_argv(root, "ldconfig", "unshare", []), timeout=120)


def proc_mounts_beneath(root: Path, mountinfo: str) -> list[str]:
    """Mount points of procfs instances at or beneath `root` (its real path), from
    /proc/self/mountinfo's text (pure apart from resolving `root`)."""
    base = os.path.realpath(root).rstrip("/") + "/"
    out: list[str] = []
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if " - " not in line or len(fields) < 5:
            continue
        fstype = line.split(" - ", 1)[1].split(" ", 1)[0]
        point = fields[4].replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n") \
            .replace("\\134", "\\")
        if fstype == "proc" and (point + "/").startswith(base):
            out.append(point)
    return sorted(set(out))


def soname_links(lib64: Path) -> list[str]:
    """Make the soname links of a freshly unpacked lib64, the links `ldconfig -n` made, from
    SONAMEs checked by nodeprep.sonames and beneath lib64's directory fd (no tool runs over the
    staged files, nothing is followed). For each SONAME of lib64's regular files with a library
    name (ldconfig's `_dl_is_dso`), `SONAME -> the newest file that has it` (ldconfig's version
    order), unless SONAME is that file itself, already resolves to it, or is no symlink (ldconfig
    leaves those too). Symlinks are never a link's target. An unsafe SONAME raises ArtifactError
    before any link is made. Returns the links made (none when lib64 is a symlink: such a root is
    incomplete, node/complete.py)."""
    try:
        dfd = os.open(lib64, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            return []
        raise
    try:
        newest: dict[str, str] = {}
        for entry in sorted(os.listdir(dfd)):
            if not _is_dso(entry):
                continue
            try:
                fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
            except OSError:  # a symlink (ELOOP) or unreadable: no library of its own
                continue
            try:
                soname = sonames.read(f"lib64/{entry}", fd) if stat.S_ISREG(os.fstat(fd).st_mode) else None
            finally:
                os.close(fd)
            if soname is not None and soname != entry and (
                    soname not in newest or _libcmp(newest[soname], entry) < 0):
                newest[soname] = entry
        made = []
        for soname, lib in sorted(newest.items()):
            if _link_to(dfd, soname, lib):
                made.append(soname)
        return made
    finally:
        os.close(dfd)


def _link_to(dfd: int, soname: str, lib: str) -> bool:
    """ldconfig's create_links in the directory `dfd`: `soname -> lib` unless it resolves to lib
    already or is something other than a symlink."""
    try:
        if os.stat(soname, dir_fd=dfd).st_ino == os.stat(lib, dir_fd=dfd, follow_symlinks=False).st_ino:
            return False
    except OSError:  # missing, dangling or a loop: made anew
        pass
    try:
        if not stat.S_ISLNK(os.stat(soname, dir_fd=dfd, follow_symlinks=False).st_mode):
            log.warning("lib64/%s is not a symbolic link: leaving it", soname)
            return False
        os.unlink(soname, dir_fd=dfd)
    except FileNotFoundError:
        pass
    os.symlink(lib, soname, dir_fd=dfd)
    return True


def _is_dso(name: str) -> bool:
    """glibc's _dl_is_dso: the names ldconfig treats as libraries."""
    return (name.startswith(("lib", "ld-")) and ".so" in name) or name.startswith(("ld.so.", "ld64.so."))


def _libcmp(a: str, b: str) -> int:
    """glibc's _dl_cache_libcmp: < 0 when library name `a` is older than `b` (digit runs compare
    as numbers)."""
    i = j = 0
    while i < len(a):
        if a[i].isdigit() and a[i].isascii():
            if not (j < len(b) and b[j].isdigit() and b[j].isascii()):
                return 1
            ei, ej = i, j
            while ei < len(a) and a[ei].isascii() and a[ei].isdigit():
                ei += 1
            while ej < len(b) and b[ej].isascii() and b[ej].isdigit():
                ej += 1
            va, vb = int(a[i:ei]), int(b[j:ej])
            if va != vb:
                return va - vb
            i, j = ei, ej
        elif j < len(b) and b[j].isascii() and b[j].isdigit():
            return -1
        elif j >= len(b) or a[i] != b[j]:
            return ord(a[i]) - (ord(b[j]) if j < len(b) else 0)
        else:
            i, j = i + 1, j + 1
    return 0 - (ord(b[j]) if j < len(b) else 0)


def read_ld_cache(layout: Layout) -> list[tuple[str, str, str]]:
    """(soname, flags, path) entries of ROOT/etc/ld.so.cache, in lookup order."""
    if imagefile.read(layout.ld_cache, limit=imagefile.MAX_LIST, what="the ld cache") is None:
        return []  # none (a FIFO or device in its place: refused, never handed to ldconfig -p)
    out = runner.run(["ldconfig", "-p", "-C", layout.ld_cache], timeout=60).stdout
    entries = []
    for line in out.splitlines()[1:]:
        line = line.strip()
        if " => " not in line or " (" not in line:
            continue
        left, path = line.rsplit(" => ", 1)
        name, flags = left.split(" (", 1)
        entries.append((name.strip(), flags.rstrip(")").strip(), path.strip()))
    return entries


def write_modprobe_conf(layout: Layout) -> bool:
    return atomic_write(layout.modprobe_conf, MODPROBE_CONF, point="activate:modprobe-conf-tmp")


def link_modules(layout: Layout, version: str, kernels: list[str]) -> bool:
    """ROOT/lib/modules/<rel>/updates/nodeprep/<m>.ko -> /opt/nvidia/current/modules/<rel>/<m>.ko
    for each module `version` ships for <rel> (relative links, so they follow `current` and work
    inside and outside --root)."""
    changed = False
    for rel in kernels:
        linkdir = layout.module_links(rel)
        linkdir.mkdir(parents=True, exist_ok=True)
        present = {p.stem for p in layout.kmod_dir(version, rel).glob("*.ko")}
        # through the text of `current`, never its resolved (possibly old) directory
        base = os.path.relpath(os.path.realpath(layout.opt), os.path.realpath(linkdir))
        for name in KERNEL_MODULES:
            link = linkdir / f"{name}.ko"
            if name in present:
                changed |= atomic_symlink(link, f"{base}/current/modules/{rel}/{name}.ko")
            elif link.is_symlink():
                link.unlink()
                changed = True
    return changed


def unlink_modules(layout: Layout, kernels: list[str]) -> bool:
    changed = False
    for rel in kernels:
        linkdir = layout.module_links(rel)
        if not linkdir.is_dir():
            continue
        for name in KERNEL_MODULES:
            link = linkdir / f"{name}.ko"
            if link.is_symlink() and "/current/modules/" in os.readlink(link):
                link.unlink()
                changed = True
        try:
            linkdir.rmdir()
        except OSError:
            pass
    return changed


def linked_kernels(layout: Layout) -> list[str]:
    base = layout.resolved("/lib/modules")
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if (p / "updates" / "nodeprep").is_dir())


def depmod(layout: Layout, kernel: str) -> None:
    argv: list[str | Path] = (["depmod", kernel] if layout.live
                              else ["depmod", "-b", depmod_base(layout, kernel), kernel])
    runner.run(argv, timeout=300)


def depmod_base(layout: Layout, kernel: str) -> Path:
    """depmod's -b under --root. depmod follows the image's links on the host, so when ROOT/lib or
    ROOT/lib/modules is a link out of the root (absolute, or `../` past it), it gets the base whose
    lib/modules/<kernel> names, link-free, the directory that resolves beneath the root."""
    real = layout.resolved(f"/lib/modules/{kernel}")
    if os.path.realpath(layout.root / "lib" / "modules" / kernel) == os.path.realpath(real):
        return layout.root
    if real.parts[-3:] == ("lib", "modules", kernel):
        return Path(*real.parts[:-3])
    raise InputError(f"{layout.node_path(real)}: /lib/modules/{kernel} of --root {layout.root} resolves "
                     "to a directory depmod cannot be pointed at",
                     hint="make /lib/modules a real directory (or /lib a link to usr/lib) in the image")


def link_firmware(layout: Layout, version: str) -> str | None:
    """ROOT/lib/firmware/nvidia/<v> -> /opt/nvidia/<v>/firmware/nvidia/<v>, where the kernel module
    looks for GSP firmware. Returns the node path of the link when nodeprep owns it, None when the
    version has no firmware or something else (a distro package) already provides the directory."""
    src = layout.version_dir(version) / "firmware" / "nvidia" / version
    if not src.is_dir():
        return None
    link = layout.firmware_link(version)
    link.parent.mkdir(parents=True, exist_ok=True)
    text = relative_target(link, src)
    if link.exists() or link.is_symlink():
        if link.is_symlink() and os.readlink(link) == text:
            return layout.node_path(link)
        log.warning("%s exists and is not nodeprep's: leaving it alone", layout.node_path(link))
        return None
    atomic_symlink(link, text)
    return layout.node_path(link)


def unlink_firmware(layout: Layout, version: str, recorded: str | None) -> bool:
    if not recorded:
        return False
    link = layout.host_path(recorded)
    if link.is_symlink() and f"opt/nvidia/{version}/firmware" in os.readlink(link):
        link.unlink()
        fsync_dir(link.parent)
        return True
    return False


# What every file nodeprep writes into a root runs (the module-load unit, the kernel hooks): the
# root's own nodeprep, found on its PATH when the root boots, never the interpreter or checkout that
# ran the install (a venv, a build machine's checkout, an upgrade moves them). docs/design-decisions.md
COMMAND = "nodeprep"
# systemd's fixed PATH for ExecStart (Debian, merged /usr or not) and the kernel hooks' own PATH
NODE_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


def nodeprep_command() -> str:
    """How the unit and the kernel hooks run nodeprep: the bare COMMAND, found on NODE_PATH."""
    return COMMAND


def _interpreter(path: Path) -> str | None:
    """The absolute interpreter a `#!` line names (None: no `#!` line, or not an absolute path).
    The root's file is hostile: opened as a regular file only, without blocking, first bytes read."""
    try:
        fd = sysfs.open_regular(path)
    except OSError:
        return None
    try:
        head = os.read(fd, 256)
    except OSError:
        return None
    finally:
        os.close(fd)
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].split()
    word = words[0].decode(errors="replace") if words else ""
    return word if word.startswith("/") else None


def command_problem(layout: Layout) -> str | None:
    """What the root lacks for the unit and the kernel hooks to run COMMAND when it boots: an
    executable COMMAND in a NODE_PATH directory whose `#!` interpreter the root has too (links
    resolved beneath ROOT); None when it has them."""
    where = "this node" if layout.live else f"the image {layout.root}"
    needs = (f": the kernel hooks and the module-load unit run `{COMMAND}` from the root's own PATH, "
             "so install nodeprep there (the nodeprep_install role or `nodeprep cloud-init`'s installer "
             "put /usr/local/bin/nodeprep), or kernels installed later get no NVIDIA modules and the "
             "unit loads none at boot (docs/node.md, \"Kernel updates\")")
    for d in NODE_PATH:
        path = layout.resolved(f"{d}/{COMMAND}")
        if not (path.is_file() and os.access(path, os.X_OK)):
            continue
        interp = _interpreter(path)
        if interp is not None and not layout.resolved(interp).is_file():
            return f"{where}: {d}/{COMMAND} runs {interp}, which it does not have" + needs
        return None
    return f"{where} has no `{COMMAND}` on its PATH ({':'.join(NODE_PATH)})" + needs


def render_unit(command: str, modules: tuple[str, ...] = DEFAULT_MODULES) -> str:
    return f"""\
# Written by nodeprep (nodeprep activate): load the active NVIDIA driver and create /dev/nvidia*
[Unit]
Description=Load NVIDIA kernel modules from /opt/nvidia/current and create device nodes (nodeprep)
Documentation=file:///opt/nvidia/current/manifest.json
DefaultDependencies=no
After=systemd-modules-load.service local-fs.target
Before=containerd.service kubelet.service
ConditionPathExists=/opt/nvidia/current/manifest.json

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={command} load-modules --modules {",".join(modules)}

[Install]
WantedBy=multi-user.target
"""


PERSISTENCED = "/opt/nvidia/current/bin/nvidia-persistenced"
PERSISTENCED_UNIT = f"""\
# Written by nodeprep (nodeprep activate): nvidia-persistenced of the active driver
[Unit]
Description=NVIDIA Persistence Daemon of the driver in /opt/nvidia/current (nodeprep)
Documentation=man:nvidia-persistenced(1) file:///opt/nvidia/current/manifest.json
Requires={UNIT_NAME}
After={UNIT_NAME}
PartOf={UNIT_NAME}
Before=containerd.service kubelet.service
ConditionPathExists={PERSISTENCED}

[Service]
Type=forking
PIDFile=/run/nvidia-persistenced/nvidia-persistenced.pid
ExecStart={PERSISTENCED} --verbose
ExecStopPost=/bin/rm -rf /run/nvidia-persistenced

[Install]
WantedBy=multi-user.target
"""


def render_persistenced_unit() -> str:
    """The unit that runs the active version's nvidia-persistenced: through `current`, so it moves with
    activate, switch and rollback (restarted on a live root, nodeprep.node.driverplan.persistenced_commands);
    part of the module-load unit, so stopping that one (to unload the modules) stops it first."""
    return PERSISTENCED_UNIT


def write_persistenced_unit(layout: Layout, wanted: bool = True) -> bool:
    """The persistenced unit and its multi-user.target.wants link (not `wanted`: the ones nodeprep
    wrote removed); True when either changed."""
    if not wanted:
        return drop_unit(layout.persistenced_unit, layout.persistenced_wants, PERSISTENCED_UNIT_NAME)
    changed = atomic_write(layout.persistenced_unit, render_persistenced_unit(),
                           point="activate:persistenced-unit-tmp")
    changed |= atomic_symlink(layout.persistenced_wants, f"../{PERSISTENCED_UNIT_NAME}")
    crash_point("activate:persistenced-unit")
    return changed


UNIT_HEADER = b"# Written by nodeprep"  # how a unit nodeprep wrote is known (uninstall reads it too)


def drop_unit(unit: Path, wants: Path, name: str) -> bool:
    """Remove the unit file `unit` when nodeprep wrote it, and its wants link when it names the unit;
    True when something was removed. Another's unit of that name is left as it is."""
    changed = False
    if os.path.islink(wants) and os.readlink(wants) == f"../{name}":
        wants.unlink()
        changed = True
    try:
        ours = not unit.is_symlink() and unit.is_file() and sysfs.read_bytes(unit, limit=1 << 20).startswith(
            UNIT_HEADER)
    except OSError:
        ours = False
    if ours:
        unit.unlink()
        changed = True
    if changed:
        fsync_dir(unit.parent)
    return changed


FABRICMANAGER = "/opt/nvidia/current/bin/nv-fabricmanager"
FABRICMANAGER_CONFIG = "/opt/nvidia/current/share/nvidia/nvswitch/fabricmanager.cfg"


def render_fabricmanager_unit(command: str, mode: str = "auto") -> str:
    """The unit that runs the active version's Fabric Manager where the machine needs it: `command
    fabric-manager --condition` (nodeprep.node.fabric's decision from the PCI devices) is its
    ExecCondition, so on a machine without an NVSwitch fabric (or a GB200/GB300, whose switches are
    managed off-host) systemd skips it instead of failing it (mode `always`: no condition, it always
    starts); ordered after the modules and persistenced and before the runtime and kubelet (the
    self-test waits for its fabric)."""
    condition = f"ExecCondition={command} fabric-manager --condition\n" if mode == "auto" else ""
    return f"""\
# Written by nodeprep (nodeprep activate): NVIDIA Fabric Manager of the active driver
[Unit]
Description=NVIDIA Fabric Manager of the driver in /opt/nvidia/current (nodeprep)
Documentation=file:///opt/nvidia/current/manifest.json
Requires={UNIT_NAME}
After={UNIT_NAME} {PERSISTENCED_UNIT_NAME}
PartOf={UNIT_NAME}
Before=containerd.service kubelet.service
ConditionPathExists={FABRICMANAGER}

[Service]
Type=forking
{condition}ExecStart={FABRICMANAGER} -c {FABRICMANAGER_CONFIG}
TimeoutStartSec=300

[Install]
WantedBy=multi-user.target
"""


def write_fabricmanager_unit(layout: Layout, mode: str = "auto") -> bool:
    """The Fabric Manager unit of `mode` (auto, always; never: the ones nodeprep wrote removed) and its
    multi-user.target.wants link; True when either changed."""
    if mode == "never":
        return drop_unit(layout.fabricmanager_unit, layout.fabricmanager_wants, FABRICMANAGER_UNIT_NAME)
    changed = atomic_write(layout.fabricmanager_unit, render_fabricmanager_unit(nodeprep_command(), mode),
                           point="activate:fabricmanager-unit-tmp")
    changed |= atomic_symlink(layout.fabricmanager_wants, f"../{FABRICMANAGER_UNIT_NAME}")
    crash_point("activate:fabricmanager-unit")
    return changed


def drift(layout: Layout, modules: tuple[str, ...] = DEFAULT_MODULES,
          daemons: Daemons = DEFAULT_DAEMONS) -> tuple[str, ...]:
    """Node paths of the files activation writes whose content differs from what it would write (a
    daemon's unit the profile does not want: none)."""
    want = {
        layout.ld_conf: LD_CONF,
        layout.modprobe_conf: MODPROBE_CONF,
        layout.unit: render_unit(nodeprep_command(), modules),
    }
    if daemons.persistenced:
        want[layout.persistenced_unit] = render_persistenced_unit()
    if daemons.fabricmanager != "never":
        want[layout.fabricmanager_unit] = render_fabricmanager_unit(nodeprep_command(), daemons.fabricmanager)
    unwanted = [path for path, off in ((layout.persistenced_unit, not daemons.persistenced),
                                       (layout.fabricmanager_unit, daemons.fabricmanager == "never"))
                if off and os.path.lexists(path)]  # activation removes them (when they are nodeprep's)
    out = []
    for path, text in want.items():
        try:  # a FIFO or link of the image in its place is never opened: it differs, and is replaced
            same = sysfs.read_bytes(path, limit=1 << 20).decode() == text
        except (OSError, UnicodeDecodeError):
            same = False
        if not same:
            out.append(layout.node_path(path))
    return tuple(out) + tuple(layout.node_path(path) for path in unwanted)


def write_unit(layout: Layout, modules: tuple[str, ...] = DEFAULT_MODULES) -> bool:
    changed = atomic_write(
        layout.unit, render_unit(nodeprep_command(), modules), point="activate:unit-tmp"
    )
    changed |= atomic_symlink(layout.unit_wants, f"../{UNIT_NAME}")
    crash_point("activate:unit")
    return changed
