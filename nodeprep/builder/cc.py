"""The kernel's compiler: CONFIG_CC_VERSION_TEXT of the headers against the build root's compiler.

Modules must be built with the compiler that built the kernel (same family and version). The
kernel records it as e.g. `CONFIG_CC_VERSION_TEXT="gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0"`;
the first word is also the program kbuild runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError

CC_TEXT_RE = re.compile(r'^CONFIG_CC_VERSION_TEXT="(?P<text>[^"]*)"\s*$', re.M)
VERSION_RE = re.compile(r"(\d+\.\d+(?:\.\d+)?)\s*$")
AFTER_PARENS_RE = re.compile(r"\)\s+(\d+\.\d+(?:\.\d+)?)\b")
AFTER_WORD_RE = re.compile(r"\bversion\s+(\d+\.\d+(?:\.\d+)?)\b")


@dataclass(frozen=True)
class Compiler:
    text: str  # the full first line, e.g. "gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0"

    @property
    def program(self) -> str:
        return self.text.split()[0] if self.text.split() else ""

    @property
    def family(self) -> str:
        prog = self.program.rsplit("/", 1)[-1]
        if "clang" in prog or "clang" in self.text.split()[1:2]:  # "Debian clang version 14.0.6"
            return "clang"
        if "gcc" in prog or prog in ("cc", "c89", "c99"):
            return "gcc"
        return prog

    @property
    def version(self) -> str:
        """Upstream version: after the packager's parentheses (gcc: "gcc (GCC) 11.4.1 20231218
        (Red Hat 11.4.1-3)"), else at the end ("… 12.2.0"), else after "version" (clang)."""
        m = (AFTER_PARENS_RE.search(self.text) or VERSION_RE.search(self.text)
             or AFTER_WORD_RE.search(self.text))
        return m[1] if m else ""

    @property
    def distro_version(self) -> str:
        """The packager's version in parentheses, e.g. 'Debian 12.2.0-14+deb12u1'."""
        m = re.search(r"\(([^)]*)\)", self.text)
        return m[1] if m else ""


def kernel_compiler(config_text: str, *, source: str = ".config") -> Compiler:
    m = CC_TEXT_RE.search(config_text)
    if not m or not m["text"].strip():
        raise InputError(f"{source}: no CONFIG_CC_VERSION_TEXT (kernel headers too old or incomplete)")
    return Compiler(m["text"].strip())


def read_kernel_compiler(headers_dir: Path) -> Compiler:
    """Compiler of the kernel whose (arch-specific) headers are in `headers_dir`."""
    for name in (".config", "include/config/auto.conf"):
        path = headers_dir / name
        if path.is_file():
            return kernel_compiler(path.read_text(errors="replace"), source=str(path))
    raise InputError(f"{headers_dir}: kernel headers have no .config")


def compiler_from_version_output(output: str) -> Compiler:
    """`gcc --version` output -> Compiler (first line)."""
    first = output.strip().splitlines()[0] if output.strip() else ""
    return Compiler(first)


def mismatch(kernel: Compiler, build: Compiler) -> str | None:
    """Why `build` cannot stand in for `kernel` (None when family and version match)."""
    if kernel.family != build.family or kernel.version != build.version:
        return f"the kernel was built with {kernel.text!r} but the build root has {build.text!r}"
    return None
