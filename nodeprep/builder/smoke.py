"""Prove that built kernel modules load on their target kernel before they are published.

The real target kernel (linux-image-<release> from the Debian archive) boots under qemu (software
emulation, one vCPU) with a minimal initramfs (nodeprep.builder.initramfs) that insmods the modules in
dependency order. Without a GPU a correct nvidia.ko gets as far as its PCI probe and fails with
ENODEV ("NVRM: No NVIDIA GPU found"); a module built for another kernel fails earlier, with the
kernel's own message ("Unknown symbol", "disagrees about version of symbol", "Invalid module
format", a rejected signature), which the verdict quotes.

The modules that need a loaded nvidia.ko (nvidia-uvm, nvidia-modeset, nvidia-drm, nvidia-peermem)
cannot load without a GPU; for them every undefined symbol is checked statically against the
kernel's Module.symvers (name, CRC, GPL-only) and the exports of the artifact's own modules.
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import runner
from ..artifact import Manifest, read_manifest
from ..artifact import extract as extract_artifact
from ..errors import ArtifactError, CommandError, InputError, NodeprepError
from ..log import step
from ..modinfo import ModuleInfo, module_name, read_module
from . import initramfs
from .console import PROBE_MODULE, classify
from .kernelfetch import Archive, Kernel, fetch_kernel, fetched_kernel
from .secureboot import OVMF_CODE, secure_boot_vars
from .symvers import check_symbols, parse_symvers

log = logging.getLogger(__name__)

BUSYBOX = Path("/bin/busybox")
QEMU = "qemu-system-x86_64"
QEMU_MEMORY_MB = 1536


# ---------------------------------------------------------------------------------------------
# Verdict


@dataclass(frozen=True)
class SmokeResult:
    verdict: str  # "PASS" | "FAIL"
    reason: str  # one line
    kernel_release: str
    log_excerpt: str  # relevant kernel log lines, timestamps stripped
    modules: dict[str, str] = field(default_factory=dict)  # module -> how it was checked / outcome
    sig_enforce: bool = False
    secure_boot: bool = False  # booted through OVMF with Secure Boot and the signing cert in db
    duration_s: float = 0.0  # not part of to_dict (artifacts stay byte-identical)
    timings: dict[str, float] = field(default_factory=dict)  # fetch / initramfs / boot seconds (ditto)

    @property
    def passed(self) -> bool:
        return self.verdict == "PASS"

    def to_dict(self) -> dict[str, Any]:
        """Deterministic summary for manifest.extra["smoke_test"]."""
        return {
            "verdict": self.verdict,
            "reason": self.reason,
            "kernel_release": self.kernel_release,
            "method": "qemu-tcg-ovmf-secureboot" if self.secure_boot else "qemu-tcg",
            "sig_enforce": self.sig_enforce,
            "secure_boot": self.secure_boot,
            "modules": dict(sorted(self.modules.items())),
            "log_excerpt": self.log_excerpt,
        }


# ---------------------------------------------------------------------------------------------
# The boot


def qemu_argv(kernel: Kernel, image: Path, *, sig_enforce: bool, uefi_vars: Path | None = None,
              memory_mb: int = QEMU_MEMORY_MB) -> list[str]:
    """qemu command line; with `uefi_vars` the kernel boots through OVMF with Secure Boot (SMM)."""
    append = "console=ttyS0 panic=-1 oops=panic quiet loglevel=3 rdinit=/init"
    if sig_enforce:
        append += " module.sig_enforce=1"
    firmware: list[str] = []
    if uefi_vars is not None:
        firmware = ["-machine", "q35,smm=on", "-global", "driver=cfi.pflash01,property=secure,value=on",
                    "-drive", f"if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE}",
                    "-drive", f"if=pflash,format=raw,unit=1,file={uefi_vars}"]
    return [QEMU, "-accel", "tcg", *firmware, "-smp", "1", "-m", str(memory_mb), "-nographic", "-no-reboot",
            "-nodefaults", "-serial", "stdio", "-nic", "none", "-kernel", str(kernel.vmlinuz),
            "-initrd", str(image), "-append", append]


def _check_busybox(path: Path) -> None:
    if not path.is_file():
        raise NodeprepError(f"{path} is missing: the smoke test needs busybox-static")
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    if b"/lib64/ld-linux" in head or b"/lib/ld-linux" in head:
        raise NodeprepError(f"{path} is dynamically linked: the smoke test needs busybox-static")


def smoke_test_modules(module_dir: Path, kernel_release: str, *, archive: Archive, cache: Path,
                       sig_enforce: bool = False, timeout: float = 120,
                       busybox: Path = BUSYBOX, console_log: Path | None = None,
                       trusted_cert: Path | None = None) -> SmokeResult:
    """Boot `kernel_release` in qemu and load the modules in `module_dir` (*.ko); see module doc.
    `console_log` keeps the whole serial console output there. With `trusted_cert` (the public
    certificate of the key the modules are signed with) the kernel boots under UEFI Secure Boot with
    that certificate in db, as on a node that enrolled it: the modules must load under lockdown and
    module.sig_enforce=1."""
    if trusted_cert is not None:
        sig_enforce = True
    start = time.monotonic()
    paths = sorted(p for p in module_dir.iterdir() if re.search(r"\.ko(\.(xz|gz|zst))?$", p.name))
    if not paths:
        raise InputError(f"{module_dir}: no kernel modules (*.ko) to test")
    _check_busybox(busybox)
    kernel = fetch_kernel(kernel_release, archive=archive, cache=cache)
    timings = {"fetch": time.monotonic() - start}
    mods = {module_name(p.name): p for p in paths}
    infos = {name: read_module(p) for name, p in mods.items()}
    dep = initramfs.parse_modules_dep((kernel.modules_dir / "modules.dep").read_text())
    symvers = parse_symvers(kernel.symvers.read_text())

    boot_modules, static_modules = split_boot_static(infos)
    static_problems: list[str] = []
    static_outcome: dict[str, str] = {}
    for name in static_modules:
        providers = [infos[d] for d in _closure(name, infos, dep) if d in infos]
        kernel_providers = [n for n in _closure(name, infos, dep) if n not in infos]
        problems = check_symbols(infos[name], symvers, providers)
        static_problems += problems
        via = ", ".join(sorted(p.name for p in providers) + kernel_providers) or "vmlinux"
        static_outcome[name] = "symbols: FAIL" if problems else f"symbols resolved ({via})"

    # Everything the initramfs loads: in-kernel dependencies of all artifact modules first.
    wanted = {n: infos[n].depends for n in boot_modules}
    for name in static_modules:
        for d in infos[name].depends:
            if d in infos:
                continue
            if d in dep:
                wanted.setdefault(d, dep[d][1])
            else:
                static_problems.append(f"{name}: depends on module {d}, which kernel {kernel_release} lacks")
                static_outcome[name] = "symbols: FAIL"
    builtin = _builtin(kernel)
    order = initramfs.load_order(wanted, dep, builtin)
    # The artifact's modules go last, so a dependency failing is never blamed on them.
    order = [n for n in order if n not in infos] + [n for n in order if n in infos]
    files: dict[str, str] = {}
    sources: dict[str, Path] = {}
    for name in order:
        src = mods[name] if name in infos else kernel.modules_dir / dep[name][0]
        fname = src.name
        for suffix in (".xz", ".gz", ".zst"):
            fname = fname.removesuffix(suffix)
        files[name], sources[fname] = fname, src
    steps = initramfs.InitSteps(load=order, files=files, stop_after=[n for n in order if n not in infos])
    lines: list[str] = []
    timed_out = False
    with tempfile.TemporaryDirectory(prefix="nodeprep-smoke-") as tmp:
        t0 = time.monotonic()
        image = initramfs.build_initramfs(Path(tmp) / "initramfs.cpio", busybox, initramfs.render_init(steps),
                                          sources)
        timings["initramfs"] = time.monotonic() - t0
        uefi_vars = None
        if trusted_cert is not None:
            uefi_vars = Path(tmp) / "vars.fd"
            shutil.copyfile(secure_boot_vars(kernel, trusted_cert, cache), uefi_vars)
        t0 = time.monotonic()
        how = " under UEFI Secure Boot" if uefi_vars else ""
        with step(f"booting {kernel_release} in qemu{how} ({', '.join(boot_modules)})", logger=log):
            try:
                runner.run(qemu_argv(kernel, image, sig_enforce=sig_enforce, uefi_vars=uefi_vars),
                           timeout=timeout, on_line=lines.append,
                           log_path=console_log or Path(tmp) / "console.log")
            except CommandError as e:
                if "timed out" not in str(e):
                    raise
                timed_out = True
        timings["boot"] = time.monotonic() - t0
    verdict, reason, excerpt, outcome = classify(
        lines, load=order, under_test=boot_modules, timed_out=timed_out, timeout=timeout,
        sig_enforce=sig_enforce, secure_boot=trusted_cert is not None)
    outcome = {k: v for k, v in outcome.items() if k in infos} | static_outcome
    if verdict == "PASS" and static_problems:
        verdict = "FAIL"
        more = len(static_problems) - 1
        reason = static_problems[0] + (f" (+{more} more)" if more else "")
    if static_problems:
        excerpt = "\n".join([*filter(None, [excerpt]), *_summarise(static_problems)])
    mismatch = vermagic_mismatch(infos.values(), kernel_release)
    if mismatch:
        excerpt = "\n".join([*filter(None, [excerpt]), mismatch])
        if verdict == "PASS":
            verdict = "FAIL"
            reason = f"{mismatch} (the kernel itself accepted the module: the symbol CRCs it checks match)"
    result = SmokeResult(verdict=verdict, reason=reason, kernel_release=kernel_release, log_excerpt=excerpt,
                         modules=outcome, sig_enforce=sig_enforce, secure_boot=trusted_cert is not None,
                         duration_s=time.monotonic() - start,
                         timings=timings)
    log.info("smoke test %s on %s: %s", verdict, kernel_release, reason)
    return result


def vermagic_mismatch(infos: Iterable[ModuleInfo], kernel_release: str) -> str | None:
    """"vermagic <release> of <module> is not kernel <release>" for the first module built for
    another kernel release (with CONFIG_MODVERSIONS the kernel compares CRCs, not the release, so it
    may load such a module; nodeprep ships a module only for the exact release it was built for)."""
    for info in sorted(infos, key=lambda i: i.name):
        built_for = info.release
        if built_for and built_for != kernel_release:
            return f"vermagic {built_for} of {info.name} is not kernel {kernel_release}"
    return None


def _summarise(problems: Sequence[str], per_module: int = 5) -> list[str]:
    """At most `per_module` problems per module, then "<module>: ... N more"."""
    out: list[str] = []
    counts: dict[str, int] = {}
    for p in problems:
        mod = p.split(":", 1)[0]
        counts[mod] = counts.get(mod, 0) + 1
        if counts[mod] <= per_module:
            out.append(p)
    out += [f"{m}: ... {n - per_module} more symbol problems" for m, n in counts.items() if n > per_module]
    return out


def split_boot_static(infos: Mapping[str, ModuleInfo]) -> tuple[list[str], list[str]]:
    """(modules to insmod for real, modules to check statically).

    When the set holds nvidia.ko only it is loaded: every other NVIDIA module needs a loaded
    nvidia.ko (uvm, modeset, drm) or hardware-specific kernel support (peermem needs the IB peer
    memory API of MLNX_OFED, absent from distribution kernels). Without nvidia.ko (any other set of
    modules), modules that depend on another module of the set are checked statically."""
    if PROBE_MODULE in infos:
        return [PROBE_MODULE], sorted(n for n in infos if n != PROBE_MODULE)
    dependent = {n for n, i in infos.items() if any(d in infos for d in i.depends)}
    while extra := {n for n, i in infos.items()
                    if n not in dependent and any(d in dependent for d in i.depends)}:
        dependent |= extra
    return [n for n in infos if n not in dependent], sorted(dependent)


def _closure(name: str, infos: Mapping[str, ModuleInfo],
             dep: Mapping[str, tuple[str, list[str]]]) -> list[str]:
    """Every module `name` depends on (artifact modules via modinfo, kernel modules via modules.dep)."""
    seen: list[str] = []
    stack = list(infos[name].depends)
    while stack:
        d = stack.pop()
        if d in seen:
            continue
        seen.append(d)
        if d in infos:
            stack += infos[d].depends
        elif d in dep:
            stack += dep[d][1]
    return seen


def _builtin(kernel: Kernel) -> list[str]:
    path = kernel.modules_dir / "modules.builtin"
    return path.read_text().split() if path.exists() else []


def smoke_test_artifact(path: Path, *, archive: Archive, cache: Path, kernel_release: str | None = None,
                        force: bool = False, sig_enforce: bool = False, timeout: float = 120,
                        console_log: Path | None = None, trusted_cert: Path | None = None) -> SmokeResult:
    """Smoke-test a kmod artifact (.tar.zst) on its own kernel, or on `kernel_release` with `force`."""
    if not path.is_file():
        raise InputError(f"{path}: no such artifact")
    with tempfile.TemporaryDirectory(prefix="nodeprep-smoke-art-") as tmp:
        manifest = extract_artifact(path, Path(tmp))
        release = boot_release(path, manifest, kernel_release, force)
        assert manifest.kernel_release is not None  # boot_release refuses a manifest without one
        module_dir = Path(tmp) / "modules" / manifest.kernel_release
        if not module_dir.is_dir():
            raise ArtifactError(f"{path}: no modules/{manifest.kernel_release}/ in the artifact")
        return smoke_test_modules(module_dir, release, archive=archive, cache=cache, sig_enforce=sig_enforce,
                                  timeout=timeout, console_log=console_log, trusted_cert=trusted_cert)


def boot_release(path: Path, manifest: Manifest, kernel_release: str | None, force: bool) -> str:
    """The kernel a smoke test of kmod artifact `path` boots: its own, or `kernel_release` with
    `force`; InputError for another kind of artifact or another kernel without `force`."""
    if manifest.kind != "kmod" or not manifest.kernel_release:
        raise InputError(f"{path}: not a kmod artifact (kind {manifest.kind})")
    release = kernel_release or manifest.kernel_release
    if release != manifest.kernel_release and not force:
        raise InputError(f"{path}: built for kernel {manifest.kernel_release}, not {release} "
                         "(add --force to boot it there anyway)")
    return release


def smoke_preview(path: Path, *, cache: Path, kernel_release: str | None = None, force: bool = False,
                  sig_enforce: bool = False, trusted_cert: Path | None = None) -> dict[str, Any]:
    """`smoke-test --check`: the kernel the test would boot and what it would fetch for it, from
    the artifact's manifest alone (nothing extracted, downloaded or booted)."""
    if not path.is_file():
        raise InputError(f"{path}: no such artifact")
    manifest = read_manifest(path)
    release = boot_release(path, manifest, kernel_release, force)
    cached = fetched_kernel(release, cache)
    return {"check": True, "artifact": str(path), "driver_version": manifest.driver_version,
            "flavour": manifest.flavour, "built_for": manifest.kernel_release, "kernel_release": release,
            "os": manifest.os, "kernel_cached": cached,
            "would_fetch": [] if cached else [f"linux-image-{release}", f"linux-headers-{release}"],
            "modules": sorted(p.rsplit("/", 1)[-1] for p in manifest.files),
            "sig_enforce": sig_enforce or trusted_cert is not None, "secure_boot": trusted_cert is not None}
