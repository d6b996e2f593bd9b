"""`--builder host`: compile against kernel headers already installed on the running system.

For a builder container of the target OS (images/<os>/Containerfile installs the exact kernel's
headers and gcc) or a build host of that OS: no mmdebstrap, no chroot. The headers directory is
`--headers-dir`, else the first of /lib/modules/<kernel>/build, /usr/src/linux-headers-<kernel>
(Debian, Ubuntu), /usr/src/kernels/<kernel> (RHEL). The compiler is the one the kernel's
CONFIG_CC_VERSION_TEXT names when it is installed (gcc-12, x86_64-linux-gnu-gcc-13, gcc), else
`$CC`, else `gcc-<major>`, else `gcc`; it is then checked like a build root's compiler.

What identifies the headers in the input digest (no .debs here): sha256 over .config,
Module.symvers and include/generated/utsrelease.h, plus the compiler's version line.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .. import runner
from ..digests import canonical_json, sha256_bytes, sha256_file
from ..errors import InputError
from ..targets import TargetOS
from . import cc, kbuild

log = logging.getLogger(__name__)

DIGEST_FILES = (".config", "Module.symvers", "include/generated/utsrelease.h")
UTS_RE = re.compile(r'#define\s+UTS_RELEASE\s+"([^"]+)"')


def header_candidates(kernel: str, root: Path = Path("/")) -> list[Path]:
    """Where an installed system keeps the headers of `kernel`, in the order they are tried."""
    return [
        root / "lib" / "modules" / kernel / "build",
        root / "usr" / "src" / f"linux-headers-{kernel}",
        root / "usr" / "src" / "kernels" / kernel,
    ]


def find_headers_dir(kernel: str | None, headers_dir: Path | None = None, root: Path = Path("/")) -> Path:
    """The headers tree to build against (must hold .config and Makefile)."""
    if headers_dir is not None:
        tried = [Path(headers_dir)]
    elif kernel:
        tried = header_candidates(kernel, root)
    else:
        raise InputError("--builder host: give --kernel RELEASE or --headers-dir DIR")
    for d in tried:
        if (d / ".config").is_file() and (d / "Makefile").is_file():
            return d
    if headers_dir is not None:
        raise InputError(
            f"--headers-dir: {headers_dir} is not a kernel headers tree (no .config or Makefile)"
        )
    raise InputError(
        f"--kernel: no headers for {kernel} on this system (tried {', '.join(map(str, tried))}); "
        "install them or pass --headers-dir"
    )


def headers_release(headers_dir: Path) -> str | None:
    """The kernel release the headers were made for (include/generated/utsrelease.h)."""
    path = headers_dir / "include" / "generated" / "utsrelease.h"
    m = UTS_RE.search(path.read_text(errors="replace")) if path.is_file() else None
    return m[1] if m else None


def headers_digest(headers_dir: Path, compiler_text: str) -> str:
    """sha256 over the files that identify a headers tree, and the compiler's version line."""
    files = {
        name: sha256_file(headers_dir / name) if (headers_dir / name).is_file() else None
        for name in DIGEST_FILES
    }
    return sha256_bytes(canonical_json({"files": files, "compiler": compiler_text}))


def select_compiler(
    kernel_cc: cc.Compiler,
    *,
    which: Callable[[str], str | None] = runner.which,
    environ: Mapping[str, str] = os.environ,
) -> str:
    """The program to compile with: the kernel's own when installed, else $CC, gcc-<major>, gcc."""
    candidates = [kernel_cc.program]
    if environ.get("CC"):
        candidates.append(environ["CC"])
    major = kernel_cc.version.split(".")[0]
    if kernel_cc.family == "gcc" and major:
        candidates.append(f"gcc-{major}")
    candidates += ["gcc", "cc"]
    for prog in candidates:
        if prog and which(prog):
            return prog
    return kernel_cc.program or "gcc"


def compiler_version(program: str) -> str:
    """First line of `<program> --version` on this system ('' when it is missing)."""
    if not runner.which(program):
        return ""
    res = runner.run([program, "--version"], check=False)
    return res.stdout.splitlines()[0].strip() if res.returncode == 0 and res.stdout else ""


@dataclass(frozen=True)
class HostRecipe:
    os_name: str
    key: str = "host"


@dataclass(frozen=True)
class HostRoot:
    """The running system as a build root: what the chroot builder's BuildRoot says about the
    root (its key and package list) is here the headers tree's digest and the compiler."""

    headers_dir: Path
    recipe: HostRecipe
    program: str  # the compiler passed to make as CC=
    compiler: str  # its version line
    headers_sha256: str

    @property
    def packages(self) -> tuple[str, ...]:
        return (f"compiler={self.compiler}", f"headers-sha256={self.headers_sha256}")

    @property
    def packages_sha256(self) -> str:
        return sha256_bytes("\n".join(self.packages).encode())


def host_root(target: TargetOS, kernel: str | None, headers_dir: Path | None) -> tuple[HostRoot, str]:
    """Find the headers and the compiler; returns the host root and the kernel release."""
    hdir = find_headers_dir(kernel, headers_dir)
    release = headers_release(hdir)
    if kernel and release and kernel != release:
        raise InputError(f"--headers-dir: {hdir} holds the headers of {release}, not --kernel {kernel}")
    release = kernel or release
    if not release:
        raise InputError(f"--headers-dir: {hdir} has no include/generated/utsrelease.h; give --kernel")
    kernel_cc = cc.read_kernel_compiler(hdir)
    program = select_compiler(kernel_cc)
    text = compiler_version(program) or f"{program} (missing)"
    build_root = HostRoot(
        headers_dir=hdir,
        recipe=HostRecipe(os_name=target.name),
        program=program,
        compiler=text,
        headers_sha256=headers_digest(hdir, text),
    )
    return build_root, release


INCLUDE_RE = re.compile(r"^include\s+(\S+)/Makefile\s*$", re.M)


def source_dir(headers_dir: Path) -> Path:
    """The kernel source headers beside an output (arch) headers tree: Debian splits them
    (linux-headers-<rel>/Makefile is `include /usr/src/linux-headers-<abi>-common/Makefile`,
    /lib/modules/<rel>/source points there); elsewhere the tree is both."""
    if headers_dir.name == "build" and (headers_dir.parent / "source").is_dir():
        return headers_dir.parent / "source"
    m = INCLUDE_RE.search((headers_dir / "Makefile").read_text(errors="replace"))
    if m and Path(m[1]).is_dir():
        return Path(m[1])
    return headers_dir


def make_vars(build_root: HostRoot, tree: Path) -> list[str]:
    """make variables for NVIDIA's Makefile on the host: the headers (SYSSRC/SYSOUT), the compiler,
    and the tree's path mapped to the chroot builder's fixed path in debug info and __FILE__."""
    return [
        f"SYSSRC={source_dir(build_root.headers_dir)}",
        f"SYSOUT={build_root.headers_dir}",
        f"CC={build_root.program}",
        f"KCFLAGS=-ffile-prefix-map={tree}={kbuild.BUILD_DIR}",
    ]
