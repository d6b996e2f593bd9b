"""Compiling the NVIDIA kernel module tree with kbuild inside a build root.

The tree (Debian's modules/nvidia-kernel/, a runfile's kernel/ / kernel-open/, or a whole
open-gpu-kernel-modules release, whose .ko land in its kernel-open/) is placed at the
fixed path BUILD_DIR inside the root, so nothing in the output depends on temporary directory
names. NVIDIA's Makefile finds the headers via /lib/modules/<release>/{build,source} (shipped by
Debian's headers packages) and picks the compiler named in CONFIG_CC_VERSION_TEXT.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import runner
from ..sources import opensource

log = logging.getLogger(__name__)

BUILD_DIR = "/build/kernel"
MODULES = ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm", "nvidia-peermem")
MAKE_TIMEOUT = 3 * 3600
# not kbuild's own .module-common.o (Linux 6.11+ compiles it once per external module build)
CC_LINE_RE = re.compile(r"^\s*CC \[M\]\s+(?!\S*/\.module-common\.o$)(\S+)")
# Fixed identity and time for anything kbuild stamps into its output.
REPRODUCIBLE_ENV = {
    "KBUILD_BUILD_TIMESTAMP": "1970-01-01",
    "KBUILD_BUILD_USER": "nodeprep",
    "KBUILD_BUILD_HOST": "nodeprep",
    "SOURCE_DATE_EPOCH": "0",
    "HOME": "/root",
    "TMPDIR": "/tmp",
}


# NVIDIA's Kbuild fragments (<module>/*.Kbuild, *-sources.mk) list each module's sources as
# `NVIDIA_UVM_SOURCES += nvidia-uvm/uvm.c`; `*_DEBUG_OPTIMIZED_SOURCE` ones are built in debug builds only.
SOURCES_RE = re.compile(r"^\s*[A-Z0-9_]*SOURCES\s*[+:?]?=(.*)$")
DEBUG_ONLY_RE = re.compile(r"^\s*[A-Z0-9_]*DEBUG_OPTIMIZED_SOURCE\s*[:?]?=\s*(\S+\.c)\b")


# An open-gpu-kernel-modules release also builds src/nvidia and src/nvidia-modeset with NVIDIA's own
# Makefiles, which list their sources in srcs.mk (`SRCS += x.c`, `SRCS_CXX += y.cpp`), add one
# generated g_nvid_string.c each, and print ` [ nvidia            ]  CC           x.c` per object.
NV_LINE_RE = re.compile(r"^\s*\[ [\w-]+\s*\]\s+(?:CC|CXX)\s+\S+\.(?:c|cpp)\s*$")
NV_SRCS_RE = re.compile(r"^\s*SRCS(?:_CXX)?\s*\+=\s*(\S+\.(?:c|cpp))\s*$")


def count_objects(tree: Path) -> int:
    """How many `CC [M]` lines a full build prints: the .c files named by the `*_SOURCES` object
    lists of each module's Kbuild fragments (less the debug-only ones), plus one <module>.mod.c per
    module. A tree without such lists (a hand-written Kbuild): every .c file it holds. A release
    tree (src/ + kernel-open/): its kernel-open/ objects plus NVIDIA's lines for src/ (NV_LINE_RE)."""
    if (tree / "kernel-open").is_dir() and (tree / "src").is_dir():
        srcs = [tree / "src" / d / "srcs.mk" for d in ("nvidia", "nvidia-modeset")]
        own = sum(
            1 + sum(1 for ln in f.read_text(errors="replace").splitlines() if NV_SRCS_RE.match(ln))
            for f in srcs
            if f.is_file()
        )
        return own + count_objects(tree / "kernel-open")
    built = [m for m in MODULES if (tree / m).is_dir()]
    listed: set[str] = set()
    debug_only: set[str] = set()
    for module in built:
        # 580 and later list nvidia-drm's sources in nvidia-drm-sources.mk, which its Kbuild includes
        for fragment in sorted([*(tree / module).glob("*.Kbuild"), *(tree / module).glob("*-sources.mk")]):
            for line in fragment.read_text(errors="replace").splitlines():
                if m := DEBUG_ONLY_RE.match(line):
                    debug_only.add(m[1])
                elif m := SOURCES_RE.match(line):
                    listed.update(w for w in m[1].split() if w.endswith(".c"))
    sources = len(listed - debug_only) if listed else sum(1 for _ in tree.rglob("*.c"))
    return sources + len(built)


@dataclass
class CompileProgress:
    """Counts compiled objects in make's output and reports (done, total) to `report`."""

    total: int
    report: Callable[[int, int], None] | None = None
    done: int = 0

    def start(self) -> None:
        """Report 0 of the total (before make prints anything: conftest runs first)."""
        if self.report:
            self.report(self.done, self.total)

    def __call__(self, line: str) -> None:
        if CC_LINE_RE.match(line) or NV_LINE_RE.match(line):
            self.done = min(self.done + 1, self.total)
            if self.report:
                self.report(self.done, self.total)


def make_argv(
    kernel_release: str,
    jobs: int,
    modules: tuple[str, ...] | None = None,
    *,
    tree: str = BUILD_DIR,
    extra: tuple[str, ...] | list[str] = (),
) -> list[str]:
    argv = ["make", "-C", tree, f"-j{jobs}", "modules", f"KERNEL_UNAME={kernel_release}", *extra]
    if modules:
        argv.append("NV_KERNEL_MODULES=" + " ".join(modules))
    return argv


def tree_path(root: Path | None, tree: str = BUILD_DIR) -> Path:
    """Where `tree` (a path inside build root `root`; None: the running system) is seen from here."""
    return root / tree.lstrip("/") if root is not None else Path(tree)


def compile_modules(
    root: Path | None,
    kernel_release: str,
    *,
    jobs: int,
    log_path: Path,
    on_line: Callable[[str], None] | None = None,
    tree: str = BUILD_DIR,
    extra: tuple[str, ...] | list[str] = (),
    out: str = "",
    cc: str | None = None,
) -> list[Path]:
    """Run kbuild in `root` (chroot; None: on this system, `--builder host`) on the module tree
    at `tree`; returns the built .ko files found in `tree`/`out` (paths as seen from here).

    `cc`: the compiler for what the tree builds outside kbuild (an open-source release's src/,
    whose Makefiles take $CC and $CXX, its C++ sibling; kbuild keeps the kernel's own)."""
    runner.run(
        make_argv(kernel_release, jobs, tree=tree, extra=extra),
        root=root,
        env=REPRODUCIBLE_ENV | ({"CC": cc, "CXX": opensource.cxx_of(cc)} if cc else {}),
        timeout=MAKE_TIMEOUT,
        on_line=on_line,
        log_path=log_path,
    )
    found = tree_path(root, tree) / out
    return [found / f"{m}.ko" for m in MODULES if (found / f"{m}.ko").is_file()]


def strip_modules(root: Path | None, names: list[str], tree: str = BUILD_DIR) -> None:
    """`strip --strip-debug` the modules <tree>/<name> with the build root's (or host's) binutils."""
    if names:
        runner.run(["strip", "--strip-debug", *[f"{tree}/{n}" for n in names]], root=root, timeout=600)


def root_compiler_version(root: Path, program: str) -> str:
    """First line of `<program> --version` run inside the build root ('' when it is missing)."""
    res = runner.run([program, "--version"], root=root, check=False)
    return res.stdout.splitlines()[0].strip() if res.returncode == 0 and res.stdout else ""
