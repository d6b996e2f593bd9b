"""What nodeprep's container hooks share: the OCI config's environment and mounts, and the image's
ld cache (read, checked for shadowing, rebuilt by the node's ldconfig confined to the image).

The CDI spec's hook (nodeprep.containerhooks.spec) and the CUDA gate (nodeprep.containerhooks.gate) run in the
container's mount namespace (mounts done, before pivot_root and before the container's process
starts), with the OCI state JSON on stdin; `bundle` names the directory holding its config.json.

The libraries (`link_libraries`, the spec's hook with `--libraries DIR --link NAME[=ENTRY]...`): the
spec mounts the driver's library folder once, at its node path (/opt/nvidia/<version>/lib64), and the
hook links each NAME in the image's loader default directory to DIR/ENTRY (ENTRY defaults to NAME):
the multiarch directory (`--ldconfig`, /usr/lib/x86_64-linux-gnu) or, in an image whose C library is
in /usr/lib64 and not there (RHEL/UBI), /usr/lib64. So glibc finds them without an ld cache entry, and
one mount stands for the 73 file mounts of both layouts. No link of the image is followed; an image's
own file of a NAME is left alone and counts as shadowing (below).

The ld cache (`check_ldcache`): only an image whose own /etc/ld.so.cache names a library of the same
name elsewhere (it would win over the default directories), that has its own file of a NAME, or whose
/etc/ld.so.conf.d has a folder of NVIDIA's `enable-cuda-compat` (00-compat-*.conf, written by that
hook just before this one) that the cache does not name yet, gets the links' directory (the library
folder when the image has its own files) written into its /etc/ld.so.conf.d/00-nodeprep-nvidia.conf
and its ld.so.cache rebuilt (`update_ldcache`).

The container is hostile (docs/threat-model.md): nothing of its rootfs is ever run. The ld cache is
rebuilt by the node's own static ldconfig (`ldconfig -r ROOTFS`: it chroots itself before reading
anything of the image) in a new mount and PID namespace with a fresh /proc mounted over the image's
(util-linux `unshare`): before pivot_root the container's /proc/1 is the runtime's init, whose root
is the node's, so without it an image's ld.so.conf or /var/cache link naming /proc/1/root/... would
reach the node. Every process a hook starts gets HOOK_ENV, never the environment it inherited, and
runs in /. Files of the image are read only when they are regular files reached without links.

Runs on every container start, so it imports only posix (os's C half: `import os` alone costs ~1.5
ms of CPU at each start), stat, sys and CPython's C JSON scanner: no os, json (its decoder imports
re), re, click, yaml, logging or argparse; `bench/container_start.py` measures it.
"""

from __future__ import annotations

import posix
import stat
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: a hook's start-up cost
if TYPE_CHECKING:
    from typing import Any

CONF_NAME = "00-nodeprep-nvidia.conf"
SYSTEM_CONF = "zz-nodeprep-system.conf"  # a /usr/lib64 image's own default folders, for a multiarch ldconfig
SYSTEM_DIRS = ("/lib64", "/usr/lib64")
COMPAT_CONF = ("00-compat-", ".conf")  # what NVIDIA's enable-cuda-compat writes (cudacompat.go)
# The node's own tools (a hook runs before pivot_root: / is the node's root), never the image's.
LDCONFIG = ("/sbin/ldconfig", "/usr/sbin/ldconfig")
UNSHARE = ("/usr/bin/unshare", "/bin/unshare")
# The whole environment of a hook (the hook entries nodeprep writes carry it: a runtime would otherwise
# start the hook with the container's, LD_PRELOAD included) and of every process a hook starts.
HOOK_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
LD_CACHE = "/etc/ld.so.cache"
MAX_CACHE = 64 << 20  # a big image's cache is a few MB
LIB64 = "/usr/lib64"  # the RHEL/UBI loader's default directory: the links go there in such an image
LIBC = "libc.so.6"  # where the image's C library is tells which default directory its loader searches
TRUE = ("1", "true", "yes", "on")



def container_env(config: dict[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in config.get("process", {}).get("env", []) or []:
        key, sep, value = item.partition("=")
        if sep:
            env[key] = value
    return env



def mounted_libraries(config: dict[str, Any], lib_dir: str) -> set[str]:
    """Names of the files the container's config mounts into `lib_dir` (pure)."""
    out = set()
    for m in config.get("mounts") or []:
        parent, _, name = str(m.get("destination", "") if isinstance(m, dict) else "").rpartition("/")
        if parent == lib_dir.rstrip("/") and name:
            out.add(name)
    return out


def shadowing_entries(cache: bytes, names: set[str], mounted_dirs: tuple[str, ...]) -> list[str]:
    """Paths in an ld.so.cache outside `mounted_dirs` whose file name is one of `names` (pure): the
    loader would take them before its default directories. ldconfig records every library under
    its soname link's path, and the paths are NUL-terminated strings of the cache's string table,
    so no parsing of its binary entries is needed; a false hit would only cost an ldconfig run."""
    dirs = {d.rstrip("/") for d in mounted_dirs}
    out = set()
    for raw in cache.split(b"\0"):
        if raw.startswith(b"/"):
            parent, _, name = raw.decode(errors="replace").rpartition("/")
            if name in names and parent not in dirs:
                out.add(f"{parent}/{name}")
    return sorted(out)


def in_image(rootfs: str, rel: str) -> str | None:
    """rootfs/rel, or None when a component of `rel` is a symbolic link: the hook runs before
    pivot_root, so an image's link would resolve against the node's root."""
    path = rootfs.rstrip("/")
    for part in rel.strip("/").split("/"):
        path = f"{path}/{part}"
        if _is_link(path):
            return None
    return path


def _is_link(path: str) -> bool:
    try:
        return stat.S_ISLNK(posix.lstat(path).st_mode)
    except OSError:
        return False


def _is_dir(path: str) -> bool:
    """A folder itself, not a link to one."""
    try:
        return stat.S_ISDIR(posix.lstat(path).st_mode)
    except OSError:
        return False


def _lexists(path: str) -> bool:
    try:
        posix.lstat(path)
    except OSError:
        return False
    return True


def node_tool(candidates: tuple[str, ...]) -> str | None:
    """The first of `candidates` that is a file on the node (not in the image)."""
    for path in candidates:
        try:
            if stat.S_ISREG(posix.stat(path).st_mode):
                return path
        except OSError:
            continue
    return None


def _write_conf(rootfs: str, name: str, folders: list[str]) -> str | None:
    """Write the image's /etc/ld.so.conf.d/`name` listing `folders`, reached without links; why
    not, or None."""
    if in_image(rootfs, "etc/ld.so.conf.d") is None:
        return "a link in the image's /etc/ld.so.conf.d path"
    try:
        dir_fd = _open_dir(rootfs, "etc/ld.so.conf.d")
        try:
            try:
                if not stat.S_ISREG(posix.lstat(name, dir_fd=dir_fd).st_mode):
                    return f"/etc/ld.so.conf.d/{name} is the image's own and no regular file"
            except FileNotFoundError:
                pass
            flags = posix.O_WRONLY | posix.O_CREAT | posix.O_TRUNC | posix.O_NOFOLLOW | posix.O_NONBLOCK
            fd = posix.open(name, flags, 0o644, dir_fd=dir_fd)
        finally:
            posix.close(dir_fd)
        with open(fd, "w") as f:
            f.write("".join(d + "\n" for d in folders))
    except OSError as e:  # read-only image: its own copies stay first
        return f"{e.strerror}: /etc/ld.so.conf.d/{name}"
    return None


def ldconfig_argv(rootfs: str, ldconfig: str, unshare: str, folders: list[str]) -> list[str]:
    """The confined ldconfig run (pure): the node's `ldconfig` chrooting itself into `rootfs`, as PID
    1 of a new PID namespace whose fresh /proc is mounted over the image's in a new mount namespace,
    so that no /proc/<pid>/root there leads out of the image."""
    return [unshare, "--mount", "--propagation", "private", "--pid", "--fork", "--kill-child",
            f"--mount-proc={rootfs.rstrip('/')}/proc", "--", ldconfig, "-r", rootfs, *folders]


def update_ldcache(rootfs: str, lib_dir: str, conf_name: str = CONF_NAME, *, compat: bool = False) -> None:
    """Add `lib_dir` to the image's ld.so.conf.d (as `conf_name`) and rebuild the image's ld cache
    with the node's ldconfig confined to it (`ldconfig_argv`). `lib_dir` is also named on ldconfig's
    command line, which puts it before every configured folder, unless `compat`: then the
    00-compat-*.conf folder (sorted before ours) stays first, as intended. An image whose C library
    is in /usr/lib64 also gets its default folders listed last (SYSTEM_CONF): a Debian ldconfig does
    not know them."""
    problem = _write_conf(rootfs, conf_name, [lib_dir])
    if problem is None and _in_image_exists(rootfs, f"{LIB64}/{LIBC}"):
        problem = _write_conf(rootfs, SYSTEM_CONF, list(SYSTEM_DIRS))
    if problem:
        print(f"nodeprep hook: ld cache not updated ({problem})", file=sys.stderr)
        return
    ldconfig, unshare = node_tool(LDCONFIG), node_tool(UNSHARE)
    if ldconfig is None or unshare is None:
        missing = LDCONFIG if ldconfig is None else UNSHARE
        print(f"nodeprep hook: ld cache not updated (the node has none of {', '.join(missing)})",
              file=sys.stderr)
        return
    proc = in_image(rootfs, "proc")
    if proc is None or not _is_dir(proc):
        print("nodeprep hook: ld cache not updated (the container's /proc is no folder)", file=sys.stderr)
        return
    # lazy: the container hook
    from .. import runner
    from ..errors import CommandError

    try:
        runner.run(ldconfig_argv(rootfs, ldconfig, unshare, [] if compat else [lib_dir]),
                   env=HOOK_ENV, sealed=True, cwd="/", timeout=30)
    except CommandError as e:
        print(f"nodeprep hook: ldconfig failed for the image: {e}", file=sys.stderr)


def open_regular(path: str) -> int | None:
    """A read descriptor of `path` when it is a regular file reached without a link at its end (no
    FIFO, device or socket of the image is ever opened), else None."""
    try:
        if not stat.S_ISREG(posix.lstat(path).st_mode):
            return None
        fd = posix.open(path, posix.O_RDONLY | posix.O_NOFOLLOW | posix.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(posix.fstat(fd).st_mode):  # replaced between the two looks
        posix.close(fd)
        return None
    return fd


def read_ld_cache(rootfs: str) -> bytes | None:
    """The image's /etc/ld.so.cache when it is a regular file reached without links (at most
    MAX_CACHE bytes), else None."""
    path = in_image(rootfs, LD_CACHE)
    fd = open_regular(path) if path else None
    if fd is None:
        return None
    with open(fd, "rb") as f:
        if posix.fstat(f.fileno()).st_size > MAX_CACHE:
            return None
        return f.read(MAX_CACHE)


def compat_folders(rootfs: str) -> list[str]:
    """Folders listed by the 00-compat-*.conf files in the image's /etc/ld.so.conf.d (NVIDIA's
    enable-cuda-compat writes one when the image's CUDA compat libraries are newer than the driver)."""
    conf_dir = in_image(rootfs, "etc/ld.so.conf.d")
    try:
        names = posix.listdir(conf_dir) if conf_dir else []
    except OSError:
        return []
    out = []
    for name in sorted(n for n in names if n.startswith(COMPAT_CONF[0]) and n.endswith(COMPAT_CONF[1])):
        fd = open_regular(f"{conf_dir}/{name}")
        if fd is None:
            continue
        with open(fd, "rb") as f:
            text = f.read(4096).decode(errors="replace")
        out += [line.strip() for line in text.splitlines() if line.strip().startswith("/")]
    return out


def uncached_folders(cache: bytes, folders: list[str]) -> list[str]:
    """Those of `folders` no path in the ld cache's string table lies in (pure)."""
    return [d for d in folders if (d.rstrip("/") + "/").encode() not in cache]


def check_ldcache(rootfs: str, names: set[str], mounted_dirs: tuple[str, ...], first: str, *,
                  shadowed: bool = False) -> None:
    """Rebuild the image's ld cache (with `first` first) only when `shadowed` (the image has its own
    file of a library's name), when the cache names one of `names` outside `mounted_dirs`, or when it
    misses a CUDA compat folder NVIDIA's enable-cuda-compat has just added."""
    cache = read_ld_cache(rootfs) or b""
    shadowed = shadowed or bool(cache and names and shadowing_entries(cache, names, mounted_dirs))
    compat = compat_folders(rootfs)
    if shadowed or uncached_folders(cache, compat):
        update_ldcache(rootfs, first, compat=bool(compat))


def _in_image_exists(rootfs: str, rel: str) -> bool:
    path = in_image(rootfs, rel)
    return path is not None and _lexists(path)


def link_dir(rootfs: str, lib_dir: str) -> str:
    """The loader default directory the links go into: LIB64 when the image's C library is there and
    not in `lib_dir` (a RHEL/UBI loader, which does not search the multiarch directory), else `lib_dir`."""
    if _in_image_exists(rootfs, f"{LIB64}/{LIBC}") and not _in_image_exists(rootfs, f"{lib_dir}/{LIBC}"):
        return LIB64
    return lib_dir


def _open_dir(rootfs: str, rel: str) -> int:
    """A descriptor of rootfs/rel reached without following a link (OSError: a link or no folder on
    the way; missing folders are made)."""
    fd = posix.open(rootfs, posix.O_RDONLY | posix.O_DIRECTORY)
    try:
        for part in rel.strip("/").split("/"):
            try:
                sub = posix.open(part, posix.O_RDONLY | posix.O_DIRECTORY | posix.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                posix.mkdir(part, 0o755, dir_fd=fd)
                sub = posix.open(part, posix.O_RDONLY | posix.O_DIRECTORY | posix.O_NOFOLLOW, dir_fd=fd)
            posix.close(fd)
            fd = sub
    except OSError:
        posix.close(fd)
        raise
    return fd


def _link(fd: int, name: str, target: str, base: str) -> bool:
    """Make `name` in the folder `fd` a link to `target`: True when it is one now, False when the
    name is the image's own (a file, or a link to elsewhere than a driver folder under `base`); a
    link to another version's folder is replaced. OSError when the image cannot be written."""
    for _ in range(3):  # again when another start sharing this rootfs changed the name meanwhile
        try:
            posix.symlink(target, name, dir_fd=fd)
            return True
        except FileExistsError:
            pass
        try:
            there = posix.readlink(name, dir_fd=fd)
        except FileNotFoundError:
            continue
        except OSError:  # a file or folder of the image's own
            return False
        if there == target:
            return True
        if not (there.startswith(base) and there.count("/") == target.count("/")):
            return False
        try:
            posix.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            pass
    return False


def link_libraries(rootfs: str, where: str, libraries: str,
                   links: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """Make where/NAME -> libraries/ENTRY in the image for each (NAME, ENTRY) of `links`; a link of
    an earlier driver (another version's folder beside `libraries`) is replaced. Returns (names
    linked, names the image has its own file or link of: left alone)."""
    base = libraries.rstrip("/").rsplit("/", 2)[0] + "/"  # /opt/nvidia/
    linked: list[str] = []
    own: list[str] = []
    try:
        fd = _open_dir(rootfs, where)
    except OSError as e:
        print(f"nodeprep hook: libraries not linked ({e.strerror}: a link or no folder at {where} in the "
              "image)", file=sys.stderr)
        return linked, own
    try:
        for name, entry in links:
            (linked if _link(fd, name, f"{libraries}/{entry}", base) else own).append(name)
    except OSError as e:  # read-only image
        print(f"nodeprep hook: libraries not linked ({e.strerror}: {where} in the image)", file=sys.stderr)
    finally:
        posix.close(fd)
    return linked, own
