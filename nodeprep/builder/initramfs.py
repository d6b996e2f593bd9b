"""A minimal initramfs for the qemu smoke test: busybox, the modules under test, the in-kernel
modules they depend on, and an /init that loads them in dependency order and prints markers.

Pure pieces (tested without qemu): the newc cpio writer, modules.dep parsing, the load order and
the /init script. `build_initramfs` is the one function that touches the filesystem.
"""

from __future__ import annotations

import gzip
import io
import logging
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ..atomicfile import atomic_write
from ..errors import ArtifactError, InputError
from ..modinfo import module_bytes, module_name

log = logging.getLogger(__name__)

NEWC_MAGIC = b"070701"
TRAILER = "TRAILER!!!"
MARKER = "NODEPREP-SMOKE"
MODULE_DIR = "/modules"


# ---------------------------------------------------------------------------------------------
# newc cpio


@dataclass(frozen=True)
class CpioEntry:
    """One archive member. `data` for regular files, `target` for symlinks, neither for directories."""

    path: str
    mode: int  # full st_mode (type bits included)
    data: bytes = b""
    target: str | None = None

    @staticmethod
    def dir(path: str, perm: int = 0o755) -> CpioEntry:
        return CpioEntry(path, stat.S_IFDIR | perm)

    @staticmethod
    def file(path: str, data: bytes, perm: int = 0o644) -> CpioEntry:
        return CpioEntry(path, stat.S_IFREG | perm, data=data)

    @staticmethod
    def symlink(path: str, target: str) -> CpioEntry:
        return CpioEntry(path, stat.S_IFLNK | 0o777, target=target)


def _pad(n: int) -> bytes:
    return b"\0" * ((4 - n % 4) % 4)


def _header(ino: int, mode: int, nlink: int, size: int, name: bytes) -> bytes:
    fields = (ino, mode, 0, 0, nlink, 0, size, 0, 0, 0, 0, len(name) + 1, 0)
    return NEWC_MAGIC + b"".join(b"%08X" % f for f in fields)


def write_newc(entries: Iterable[CpioEntry], out: BinaryIO) -> int:
    """Write `entries` as a newc ("070701") archive with uid/gid 0 and mtime 0; returns bytes written.

    Parent directories must come before their contents (the kernel does not create them).
    """
    written = 0
    ino = 0
    for entry in [*entries, CpioEntry(TRAILER, 0)]:
        name = entry.path.lstrip("/").encode() if entry.path != TRAILER else entry.path.encode()
        if not name or b"\0" in name:
            raise ValueError(f"invalid cpio member name {entry.path!r}")
        payload = entry.target.encode() if entry.target is not None else entry.data
        ino += 1
        nlink = 2 if stat.S_ISDIR(entry.mode) else 1
        head = _header(ino if entry.path != TRAILER else 0, entry.mode, nlink if entry.path != TRAILER else 1,
                       len(payload), name)
        chunk = head + name + b"\0"
        chunk += _pad(len(chunk))
        out.write(chunk)
        out.write(payload)
        out.write(_pad(len(payload)))
        written += len(chunk) + len(payload) + len(_pad(len(payload)))
    tail = _pad(written) if written % 512 == 0 else b"\0" * (512 - written % 512)
    out.write(tail)
    return written + len(tail)


# ---------------------------------------------------------------------------------------------
# modules.dep and load order


def parse_modules_dep(text: str) -> dict[str, tuple[str, list[str]]]:
    """modules.dep -> {module name: (path relative to /lib/modules/<release>, [dependency names])}.

    Each line is "path: dep-path dep-path ..."; depmod lists the full transitive closure.
    """
    result: dict[str, tuple[str, list[str]]] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        path, sep, rest = line.partition(":")
        if not sep:
            raise InputError(f"modules.dep line {n}: missing ':'")
        result[module_name(path)] = (path.strip(), [module_name(d) for d in rest.split()])
    return result


def load_order(wanted: Mapping[str, Sequence[str]], modules_dep: Mapping[str, tuple[str, list[str]]],
               builtin: Iterable[str] = ()) -> list[str]:
    """Modules to insmod, dependencies first.

    `wanted` maps each module under test to its modinfo `depends`; those dependencies are looked up
    in `wanted` first, then in the kernel's modules.dep (transitively). Built-in modules are skipped.
    Raises InputError for a dependency the kernel does not have.
    """
    builtin_set = {module_name(b) for b in builtin}
    order: list[str] = []
    visiting: set[str] = set()

    def deps_of(name: str) -> list[str]:
        if name in wanted:
            return [module_name(d) for d in wanted[name] if d]
        return list(modules_dep[name][1])

    def visit(name: str, needed_by: str | None) -> None:
        if name in order or name in builtin_set:
            return
        if name not in wanted and name not in modules_dep:
            who = f" (needed by {needed_by})" if needed_by else ""
            raise InputError(f"module {name}{who} is neither in the artifact nor in the kernel's modules.dep")
        if name in visiting:
            raise InputError(f"module dependency cycle through {name}")
        visiting.add(name)
        for dep in deps_of(name):
            visit(dep, name)
        visiting.discard(name)
        order.append(name)

    for name in wanted:
        visit(name, None)
    return order


# ---------------------------------------------------------------------------------------------
# /init


@dataclass(frozen=True)
class InitSteps:
    """What /init does: insmod each module in `load` (dependencies first), in order; `expect_enodev`
    are the modules allowed to fail with ENODEV (no GPU); a failed dependency stops the run."""

    load: list[str]
    files: dict[str, str]  # module name -> file name under MODULE_DIR
    stop_after: list[str] = field(default_factory=list)  # load nothing after these fail


def render_init(steps: InitSteps) -> str:
    """The busybox sh /init script. Output lines start with MARKER so they can be parsed."""
    lines = [
        "#!/bin/busybox sh",
        "/bin/busybox mkdir -p /proc /sys /dev /tmp",
        "/bin/busybox mount -t proc proc /proc",
        "/bin/busybox mount -t sysfs sysfs /sys",
        "/bin/busybox mount -t devtmpfs devtmpfs /dev 2>/dev/null",
        "B=/bin/busybox",
        "$B mount -t securityfs securityfs /sys/kernel/security 2>/dev/null",
        f'echo "{MARKER}: begin $($B uname -r)"',
        f'echo "{MARKER}: lockdown $($B cat /sys/kernel/security/lockdown 2>/dev/null || echo unknown)"',
        # how the kernel came up: Secure Boot state and the certificates it trusts
        "$B dmesg | $B grep -E 'secureboot: |Loaded X.509 cert' | $B sed -e 's/^\\[[ 0-9.]*\\] *//' |"
        f' while IFS= read -r l; do echo "{MARKER}: boot $l"; done',
        "$B dmesg -c >/dev/null",
        "report() {",
        "  $B dmesg -c | while IFS= read -r l; do echo \"" + MARKER + ": kmsg $l\"; done",
        "}",
    ]
    for name in steps.load:
        fname = steps.files[name]
        lines += [
            f'echo "{MARKER}: insmod {name}"',
            f"out=$($B insmod {MODULE_DIR}/{fname} 2>&1); rc=$?",
            "report",
            f'echo "{MARKER}: result {name} rc=$rc $out"',
        ]
        if name in steps.stop_after:
            lines.append(f'[ $rc -eq 0 ] || {{ echo "{MARKER}: end"; $B poweroff -f; }}')
    lines += [
        f'echo "{MARKER}: end"',
        "$B poweroff -f",
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# the image


def initramfs_entries(busybox: Path, init: str, modules: Mapping[str, Path]) -> list[CpioEntry]:
    """Members of the image: /bin/busybox, /init, and `modules` (file name -> source path)."""
    if not busybox.is_file():
        raise ArtifactError(f"{busybox}: busybox (static) is missing; install busybox-static")
    entries = [CpioEntry.dir(d) for d in ("bin", "dev", "proc", "sys", "tmp", MODULE_DIR.strip("/"))]
    entries.append(CpioEntry.file("bin/busybox", busybox.read_bytes(), 0o755))
    entries.append(CpioEntry.symlink("bin/sh", "busybox"))
    entries.append(CpioEntry.file("init", init.encode(), 0o755))
    for fname, src in sorted(modules.items()):
        entries.append(CpioEntry.file(f"{MODULE_DIR.strip('/')}/{fname}", module_bytes(src)))
    return entries


def build_initramfs(dest: Path, busybox: Path, init: str, modules: Mapping[str, Path], *,
                    compress: bool = False) -> Path:
    """Write the initramfs to `dest` (newc, gzip when `compress`; the kernel takes either)."""
    buf = io.BytesIO()
    write_newc(initramfs_entries(busybox, init, modules), buf)
    data = buf.getvalue()
    if compress:
        data = gzip.compress(data, compresslevel=1, mtime=0)
    atomic_write(dest, data)
    log.debug("initramfs %s: %d modules, %d bytes", dest, len(modules), len(data))
    return dest
