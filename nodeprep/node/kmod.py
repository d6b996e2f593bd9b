"""Kernel modules: vermagic comparison, the target kernel, the facts of built modules.

A vermagic string is `<release> <flags...>`, e.g. `6.1.0-28-amd64 SMP preempt mod_unload modversions `.
The kernel refuses a module whose vermagic differs from its own (unless forced), so nodeprep refuses
it first: the release must equal the target kernel's, and when the target kernel's own modules are
present under ROOT/lib/modules/<release>/kernel, their flags must match too. Modules are read by
nodeprep.modinfo from their bytes (the same `.modinfo` strings modinfo(8) prints), not by running
modinfo: no dependency on kmod's tools under --root, and no process per module.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ..elf import ElfError
from ..errors import InputError
from ..modinfo import ModuleInfo, Vermagic, parse_vermagic, read_module
from ..profile.fields import field_error
from .layout import Layout, check_kernel

log = logging.getLogger(__name__)


def vermagic_problem(module: Vermagic, kernel: Vermagic | str) -> str | None:
    """Why a module with vermagic `module` cannot load into `kernel` (a Vermagic, or only a
    release when the kernel's own modules are not at hand); None when it can."""
    release = kernel if isinstance(kernel, str) else kernel.release
    if module.release != release:
        return (
            f"the module is built for kernel {module.release} but the target kernel is {release} "
            f"(vermagic mismatch)"
        )
    if isinstance(kernel, Vermagic) and module.flags != kernel.flags:
        only_mod = sorted(module.flags - kernel.flags)
        only_kernel = sorted(kernel.flags - module.flags)
        return (
            f"vermagic flags differ from kernel {release}'s: module has {only_mod or '-'}, "
            f"kernel has {only_kernel or '-'}"
        )
    return None


def running_kernel() -> str:
    return os.uname().release


def target_kernel(layout: Layout, kernel: str | None) -> str:
    """--kernel, or the running kernel on a live system; required with --root."""
    if kernel:
        return check_kernel(kernel)
    if not layout.live:
        raise field_error("driver.kernel", "required with --root (the running kernel is not the image's)")
    return running_kernel()


def _facts(path: Path) -> ModuleInfo:
    """The facts of the module file `path`; InputError naming it when it is no readable module."""
    try:
        return read_module(path)
    except ElfError as e:
        raise InputError(str(e)) from None


def kernel_vermagic(layout: Layout, release: str) -> Vermagic | None:
    """The vermagic of the target kernel, read from one of its own modules under ROOT (None when the
    kernel's modules are not installed there, e.g. an image built before its kernel)."""
    base = layout.resolved(f"/lib/modules/{check_kernel(release)}/kernel")
    if not base.is_dir():
        return None
    for pattern in ("*.ko", "*.ko.xz", "*.ko.zst", "*.ko.gz"):
        for p in sorted(base.rglob(pattern))[:3]:
            try:
                return parse_vermagic(_facts(p).vermagic)
            except InputError:
                continue
    return None


def check_modules(directory: Path, release: str, kernel_magic: Vermagic | None) -> dict[str, str]:
    """Read every .ko in `directory`; refuse any whose vermagic does not fit the target kernel.
    Returns module name -> version."""
    versions: dict[str, str] = {}
    kos = sorted(directory.glob("*.ko"))
    if not kos:
        raise InputError(f"{directory.name}: the kmod artifact contains no .ko files")
    for ko in kos:
        facts = _facts(ko)
        try:
            magic = parse_vermagic(facts.vermagic)
        except InputError:
            raise InputError(f"{ko.name}: no vermagic (not a module built by kbuild)") from None
        problem = vermagic_problem(magic, kernel_magic or release)
        if problem:
            raise InputError(f"{ko.name}: {problem}")
        versions[ko.stem] = facts.version
    return versions
