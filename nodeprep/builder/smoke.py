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

import fcntl
import logging
import os
import re
import shutil
import struct
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .. import runner
from ..artifact import extract as extract_artifact
from ..errors import ArtifactError, CommandError, InputError, NodeprepError
from ..log import step
from . import initramfs
from .signing import has_signature

log = logging.getLogger(__name__)

BUSYBOX = Path("/bin/busybox")
QEMU = "qemu-system-x86_64"
QEMU_MEMORY_MB = 1536
GPL_COMPATIBLE = frozenset({"GPL", "GPL v2", "GPL and additional rights", "Dual BSD/GPL", "Dual MIT/GPL",
                            "Dual MPL/GPL"})
PROBE_MODULE = "nvidia"  # the one module whose load is expected to stop at the (missing) GPU
ENODEV_TEXT = "No such device"
NO_GPU_TEXT = "No NVIDIA GPU found"


class Archive(Protocol):
    """What the smoke test needs from nodeprep.sources.debian.DebianArchive."""

    def download(self, package: str, version: str | None = None) -> Path: ...

    def extract(self, deb: Path, dest: Path) -> None: ...


# ---------------------------------------------------------------------------------------------
# Kernel module ELF files (x86-64, little endian)


@dataclass(frozen=True)
class KmodInfo:
    """What the loader looks at in a .ko: .modinfo, undefined symbols, exports, __versions CRCs."""

    name: str
    modinfo: dict[str, list[str]]
    undefined: list[str]
    exports: list[str]
    versions: dict[str, int]
    signed: bool

    def field(self, key: str) -> str:
        values = self.modinfo.get(key, [])
        return values[0] if values else ""

    @property
    def depends(self) -> list[str]:
        return [initramfs.module_name(d) for d in self.field("depends").split(",") if d]

    @property
    def vermagic(self) -> str:
        return self.field("vermagic")

    @property
    def gpl_compatible(self) -> bool:
        return self.field("license") in GPL_COMPATIBLE


def _sections(data: bytes) -> dict[str, tuple[int, int, int, int, int]]:
    """{section name: (type, offset, size, link, entsize)}."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ArtifactError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab_off = headers[shstrndx][4]

    def name(off: int) -> str:
        end = data.index(b"\0", strtab_off + off)
        return data[strtab_off + off:end].decode()

    result: dict[str, tuple[int, int, int, int, int]] = {}
    for i, h in enumerate(headers):
        result.setdefault(name(h[0]), (h[1], h[4], h[5], h[6], h[9]))
        result.setdefault(f"#{i}", (h[1], h[4], h[5], h[6], h[9]))
    return result


def parse_kmod(data: bytes, name: str) -> KmodInfo:
    """Parse a kernel module's ELF image (signature trailer allowed)."""
    try:
        secs = _sections(data)
        modinfo: dict[str, list[str]] = {}
        if ".modinfo" in secs:
            _, off, size, _, _ = secs[".modinfo"]
            for item in data[off:off + size].split(b"\0"):
                if b"=" in item:
                    k, _, v = item.decode("utf-8", "replace").partition("=")
                    modinfo.setdefault(k, []).append(v)
        undefined: list[str] = []
        exports: list[str] = []
        if ".symtab" in secs:
            _, off, size, link, entsize = secs[".symtab"]
            _, stroff, _, _, _ = secs[f"#{link}"]
            for i in range(1, size // (entsize or 24)):
                st_name, st_info, _, st_shndx = struct.unpack_from("<IBBH", data, off + i * 24)
                if not st_name:
                    continue
                end = data.index(b"\0", stroff + st_name)
                sym = data[stroff + st_name:end].decode()
                if st_shndx == 0 and (st_info & 0xF) != 4:  # SHN_UNDEF, not STT_FILE
                    undefined.append(sym)
                elif sym.startswith("__ksymtab_") and sym not in ("__ksymtab_gpl", "__ksymtab_strings"):
                    exports.append(sym.removeprefix("__ksymtab_"))
        versions: dict[str, int] = {}
        if "__versions" in secs:
            _, off, size, _, _ = secs["__versions"]
            for i in range(0, size, 64):
                crc, = struct.unpack_from("<Q", data, off + i)
                raw = data[off + i + 8:off + i + 64]
                versions[raw.split(b"\0", 1)[0].decode()] = crc & 0xFFFFFFFF
    except (struct.error, ValueError, IndexError, UnicodeDecodeError, KeyError) as e:
        raise ArtifactError(f"{name}: not a valid kernel module ({e})") from None
    return KmodInfo(name=name, modinfo=modinfo, undefined=sorted(set(undefined)),
                    exports=sorted(set(exports)), versions=versions, signed=has_signature(data))


def read_kmod(path: Path) -> KmodInfo:
    return parse_kmod(initramfs._read_module(path), initramfs.module_name(path.name))


# ---------------------------------------------------------------------------------------------
# Static symbol check (for the modules that cannot load without a GPU)


@dataclass(frozen=True)
class Export:
    crc: int
    module: str  # "vmlinux" or a module path without .ko
    gpl_only: bool


def parse_symvers(text: str) -> dict[str, Export]:
    """Module.symvers ("0xCRC<TAB>symbol<TAB>module<TAB>EXPORT_SYMBOL[_GPL]<TAB>namespace")."""
    result: dict[str, Export] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) < 4:
            raise InputError(f"Module.symvers line {n}: expected 4 or 5 tab-separated fields")
        result[parts[1]] = Export(int(parts[0], 16), parts[2], parts[3] == "EXPORT_SYMBOL_GPL")
    return result


def check_symbols(module: KmodInfo, symvers: Mapping[str, Export],
                  providers: Iterable[KmodInfo] = ()) -> list[str]:
    """Problems the kernel would report when loading `module` after `providers`: undefined symbols
    nobody exports, CRC mismatches against the kernel's exports, GPL-only symbols used by a
    module whose licence is not GPL-compatible. Empty list: every symbol resolves."""
    provided = {sym: p.name for p in providers for sym in p.exports}
    problems: list[str] = []
    layout = module.versions.get("module_layout")
    if layout is not None and "module_layout" in symvers and symvers["module_layout"].crc != layout:
        problems.append(f"{module.name}: disagrees about version of symbol module_layout "
                        f"(module 0x{layout:08x}, kernel 0x{symvers['module_layout'].crc:08x})")
    for sym in module.undefined:
        if sym in provided:
            continue
        export = symvers.get(sym)
        if export is None:
            problems.append(f"{module.name}: Unknown symbol {sym}")
            continue
        crc = module.versions.get(sym)
        if crc is not None and crc != export.crc:
            problems.append(f"{module.name}: disagrees about version of symbol {sym} "
                            f"(module 0x{crc:08x}, kernel 0x{export.crc:08x})")
        if export.gpl_only and not module.gpl_compatible:
            problems.append(f"{module.name}: uses GPL-only symbol {sym} with licence "
                            f"{module.field('license')!r}")
    return problems


# ---------------------------------------------------------------------------------------------
# The target kernel


@dataclass(frozen=True)
class Kernel:
    release: str
    root: Path  # extracted linux-image (+ Module.symvers)

    @property
    def vmlinuz(self) -> Path:
        return self.root / "boot" / f"vmlinuz-{self.release}"

    @property
    def modules_dir(self) -> Path:
        return self.root / "lib" / "modules" / self.release

    @property
    def symvers(self) -> Path:
        return self.root / "Module.symvers"


def fetch_kernel(release: str, *, archive: Archive, cache: Path) -> Kernel:
    """linux-image-<release> (and Module.symvers from linux-headers-<release>) extracted under
    `cache`/kernels/<release>, with modules.dep generated by depmod. Cached: a second call is free."""
    if not re.fullmatch(r"[0-9][A-Za-z0-9.+_~-]*", release):
        raise InputError(f"invalid kernel release {release!r}")
    dest = cache / "kernels" / release
    kernel = Kernel(release, dest)
    if (dest / ".complete").exists():
        return kernel
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{release}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another build or test may be fetching the same kernel
        if not (dest / ".complete").exists():
            _fetch_kernel(release, archive, dest)
    return kernel


def _merge_usr(root: Path) -> None:
    """Trixie's kernel packages ship their modules under usr/lib/modules (merged /usr): link lib to
    usr/lib, as a merged-/usr system does, so modules_dir and `depmod -b` find them."""
    if (root / "usr" / "lib" / "modules").is_dir() and not (root / "lib").exists():
        (root / "lib").symlink_to("usr/lib")


def _fetch_kernel(release: str, archive: Archive, dest: Path) -> None:
    with step(f"fetching kernel {release}", logger=log):
        image = archive.download(f"linux-image-{release}")
        headers = archive.download(f"linux-headers-{release}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{release}.", dir=dest.parent))
        try:
            archive.extract(image, tmp)
            _merge_usr(tmp)
            with tempfile.TemporaryDirectory(dir=dest.parent) as htmp:
                archive.extract(headers, Path(htmp))
                found = list(Path(htmp).glob(f"usr/src/linux-headers-{release}/Module.symvers"))
                if not found:
                    raise ArtifactError(f"linux-headers-{release} has no Module.symvers")
                shutil.copyfile(found[0], tmp / "Module.symvers")
            k = Kernel(release, tmp)
            if not k.vmlinuz.is_file() or not k.modules_dir.is_dir():
                raise ArtifactError(f"linux-image-{release} has no {k.vmlinuz.name} or module tree")
            runner.run(["depmod", "-b", tmp, release])
            (tmp / ".complete").write_text(release + "\n")
            if dest.exists():
                shutil.rmtree(dest)
            tmp.rename(dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


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


_TS = re.compile(r"^\[\s*\d+\.\d+\]\s?")
_TS_ANYWHERE = re.compile(r"\[\s*\d+\.\d+\]")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1bc")
_RESULT = re.compile(rf"^{initramfs.MARKER}: result (\S+) rc=(\d+) ?(.*)$")
_KMSG = re.compile(rf"^{initramfs.MARKER}: kmsg (.*)$")
CRASH_PATTERNS = ("Kernel panic", "BUG:", "Oops:", "general protection fault", "Call Trace:",
                  "WARNING: CPU:", "RIP:")
RELEVANT = re.compile(
    r"NVRM|nvidia|Unknown symbol|disagrees about version|version magic|module verification failed|"
    r"Loading of .* is rejected|signature|Key was rejected|Required key|Invalid module format|"
    r"taints kernel|module_layout|No such device|Kernel panic|BUG:|Oops:|general protection fault|"
    r"Call Trace:|RIP:|WARNING: CPU:")


def _clean(line: str) -> str:
    return _TS.sub("", _ANSI.sub("", line).replace("\r", "")).rstrip()


def _insmod_error(out: str) -> str:
    """busybox insmod's "insmod: can't insert '/modules/x.ko': No such device" -> "No such device"."""
    return re.sub(r"^insmod: can't insert '[^']*': ", "", out.strip())


@dataclass(frozen=True)
class Boot:
    """Parsed console output of one smoke boot."""

    started: bool
    finished: bool
    results: dict[str, tuple[int, str]]  # module -> (insmod exit status, insmod message)
    kmsg: dict[str, list[str]]  # module -> kernel messages while it was loaded (no timestamps)
    crash: list[str]  # oops/panic lines (console and kmsg)
    lockdown: str = ""  # /sys/kernel/security/lockdown, e.g. "none [integrity] confidentiality"
    boot: list[str] = field(default_factory=list)  # "secureboot: …", "Loaded X.509 cert …" lines


def parse_console(lines: Sequence[str]) -> Boot:
    started = finished = False
    results: dict[str, tuple[int, str]] = {}
    kmsg: dict[str, list[str]] = {}
    crash: list[str] = []
    current = ""
    lockdown = ""
    boot_lines: list[str] = []
    for raw in lines:
        line = _ANSI.sub("", raw).replace("\r", "").rstrip()
        # The marker may follow leftover console output on the same line.
        idx = line.find(initramfs.MARKER + ":")
        if idx > 0:
            line = line[idx:]
        if line.startswith(f"{initramfs.MARKER}: begin"):
            started = True
        elif line == f"{initramfs.MARKER}: end":
            finished = True
        elif line.startswith(f"{initramfs.MARKER}: lockdown "):
            lockdown = line.split(" ", 2)[2].strip()
        elif line.startswith(f"{initramfs.MARKER}: boot "):
            boot_lines.append(_clean(line.split(" ", 2)[2]))
        elif line.startswith(f"{initramfs.MARKER}: insmod "):
            current = line.split()[-1]
            kmsg.setdefault(current, [])
        elif m := _RESULT.match(line):
            results[m.group(1)] = (int(m.group(2)), _insmod_error(_clean(m.group(3))))
        elif m := _KMSG.match(line):
            text = _clean(m.group(1))
            kmsg.setdefault(current, []).append(text)
            if any(p in text for p in CRASH_PATTERNS):
                crash.append(text)
        else:
            ts = _TS_ANYWHERE.search(line)  # kernel output may follow firmware noise on one line
            text = _clean(line[ts.start():] if ts else line)
            if any(p in text for p in CRASH_PATTERNS):
                crash.append(text)
    return Boot(started, finished, results, kmsg, crash, lockdown, boot_lines)


_KERNEL_REASONS = (
    (re.compile(r"Loading of unsigned module is rejected"),
     "unsigned module rejected (module.sig_enforce=1)"),
    (re.compile(r"Loading of module with unavailable key is rejected"),
     "signed with a key the kernel does not trust (module.sig_enforce=1)"),
    (re.compile(r"Lockdown: .*unsigned module loading is restricted"),
     "rejected by Secure Boot lockdown (unsigned, or signed with a key the kernel does not trust)"),
    (re.compile(r"Loading of module with unsupported crypto is rejected"),
     "signature uses crypto the kernel does not support"),
    (re.compile(r"Unknown symbol \S+"), None),
    (re.compile(r"disagrees about version of symbol \S+"), None),
    (re.compile(r"version magic '.*' should be '.*'"), None),
)


def _kernel_reason(messages: Sequence[str]) -> str | None:
    for pattern, text in _KERNEL_REASONS:
        for msg in messages:
            if m := pattern.search(msg):
                if text is None:
                    hits = {h.group(0) for x in messages if (h := pattern.search(x))}
                    more = f" (+{len(hits) - 1} more)" if len(hits) > 1 else ""
                    return m.group(0) + more
                return text
    return None


def classify(lines: Sequence[str], *, load: Sequence[str], under_test: Sequence[str],
             probe: str = PROBE_MODULE, timed_out: bool = False, timeout: float = 0,
             sig_enforce: bool = False, secure_boot: bool = False) -> tuple[str, str, str, dict[str, str]]:
    """(verdict, reason, log excerpt, per-module outcome) from the console of a smoke boot.

    `load` is what /init insmods, in order; `under_test` the artifact's modules among them. PASS:
    every module loaded, except `probe` which may fail only with ENODEV (no GPU)."""
    boot = parse_console(lines)
    excerpt_lines: list[str] = []
    if secure_boot:
        excerpt_lines += [x for x in boot.boot if "secureboot:" in x or "UEFI" in x or "integrity:" in x]
        excerpt_lines.append(f"lockdown: {boot.lockdown or 'unknown'}")
    for name in load:
        for msg in boot.kmsg.get(name, []):
            if name in under_test or RELEVANT.search(msg):
                if RELEVANT.search(msg) or msg.startswith(("NVRM", name)):
                    excerpt_lines.append(msg)
        if name in boot.results:
            rc, out = boot.results[name]
            excerpt_lines.append(f"insmod {name}: " + (out or "ok") if rc else f"insmod {name}: ok")
    excerpt_lines += [c for c in boot.crash if c not in excerpt_lines]
    excerpt = "\n".join(dict.fromkeys(excerpt_lines))
    outcome: dict[str, str] = {}

    def fail(reason: str) -> tuple[str, str, str, dict[str, str]]:
        return "FAIL", reason, excerpt, outcome

    if boot.crash:
        return fail(f"kernel crashed: {boot.crash[0]}")
    if not boot.started:
        tail = [_clean(x) for x in lines if _clean(x)][-3:]
        why = f"timed out after {timeout:g}s" if timed_out else "did not reach /init"
        return fail(f"kernel {why} before loading modules" + (f": {tail[-1]}" if tail else ""))
    locked = re.search(r"\[(integrity|confidentiality)\]", boot.lockdown)
    if secure_boot and not locked:
        return fail(f"Secure Boot did not lock the kernel down (lockdown: {boot.lockdown or 'unknown'})")
    for name in load:
        if name not in boot.results:
            why = f"timed out after {timeout:g}s" if timed_out else "boot ended"
            return fail(f"{why} while loading {name}")
        rc, out = boot.results[name]
        messages = boot.kmsg.get(name, [])
        if rc == 0:
            outcome[name] = "loaded"
            continue
        if name == probe and ENODEV_TEXT in out and any(NO_GPU_TEXT in m for m in messages):
            outcome[name] = "probe: no GPU (ENODEV)"
            continue
        kernel_says = _kernel_reason(messages)
        if name == probe and ENODEV_TEXT in out and not kernel_says:
            kernel_says = f"ENODEV without reaching the GPU probe (no \"NVRM: {NO_GPU_TEXT}\")"
        what = "module under test" if name in under_test else "in-kernel dependency"
        reason = f"{name} ({what}) failed to load: {kernel_says or out or f'insmod exit {rc}'}"
        if kernel_says and out:
            reason += f" (insmod: {out})"
        outcome[name] = "FAIL"
        return fail(reason)
    if not boot.finished and timed_out:
        return fail(f"timed out after {timeout:g}s after loading modules")
    if outcome.get(probe, "").startswith("probe"):
        reason = f"{probe} loaded up to the GPU probe (NVRM: {NO_GPU_TEXT})"
    else:
        reason = f"{len(under_test)} module(s) loaded"
    if any("module verification failed" in m for ms in boot.kmsg.values() for m in ms) and not sig_enforce:
        reason += "; unsigned or untrusted signature accepted (kernel tainted, not enforced)"
    if secure_boot and locked:
        reason += f" under UEFI Secure Boot (lockdown: {locked.group(1)})"
    elif sig_enforce:
        reason += " with module.sig_enforce=1"
    return "PASS", reason, excerpt, outcome


# ---------------------------------------------------------------------------------------------
# UEFI Secure Boot (OVMF): the kernel's own signer and the operator's certificate in db


OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.secboot.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")
SB_OWNER_GUID = "9f3b7b3c-5d8e-4b55-9a59-6e6f64657072"  # "nodeprep" owner of the db entries


def pe_signature(image: bytes) -> bytes:
    """The PKCS#7 (Authenticode) blob of a signed PE image, e.g. Debian's EFI-stub vmlinuz."""
    try:
        pe = struct.unpack_from("<I", image, 0x3C)[0]
        if image[pe:pe + 4] != b"PE\0\0":
            raise ValueError("no PE header")
        magic = struct.unpack_from("<H", image, pe + 24)[0]
        ddir = pe + 24 + (112 if magic == 0x20B else 96)
        off, size = struct.unpack_from("<II", image, ddir + 4 * 8)  # IMAGE_DIRECTORY_ENTRY_SECURITY
        if not off or not size:
            raise ValueError("not signed")
        length, _, kind = struct.unpack_from("<IHH", image, off)
        if kind != 2:  # WIN_CERT_TYPE_PKCS_SIGNED_DATA
            raise ValueError(f"certificate type {kind}")
        return image[off + 8:off + length]
    except (struct.error, ValueError) as e:
        raise ArtifactError(f"kernel image has no usable Authenticode signature ({e})") from None


def _virt_fw_vars() -> str:
    import sys

    tool = Path(sys.executable).parent / "virt-fw-vars"
    found = str(tool) if tool.exists() else runner.which("virt-fw-vars")
    if not found:
        raise NodeprepError("virt-fw-vars not found: the Secure Boot smoke test needs the virt-firmware "
                            "Python package (scripts/deps/smoke.pip)")
    return found


def secure_boot_vars(kernel: Kernel, trusted_cert: Path, cache: Path) -> Path:
    """An OVMF variable store with Secure Boot on, a throw-away PK/KEK, and in db: the certificate that
    signed the kernel image (so OVMF boots it) and `trusted_cert` (the operator's module signing key;
    the kernel loads db into its platform keyring). Cached by content."""
    for f in (OVMF_CODE, OVMF_VARS):
        if not f.is_file():
            raise NodeprepError(f"{f} is missing: the Secure Boot smoke test needs the ovmf package")
    if not trusted_cert.is_file():
        raise InputError(f"--trust-cert: {trusted_cert} does not exist")
    from ..digests import sha256_bytes, sha256_file

    key = sha256_bytes(f"{sha256_file(kernel.vmlinuz)} {sha256_file(trusted_cert)} "
                       f"{sha256_file(OVMF_VARS)}".encode())[:16]
    dest = cache / "secureboot" / f"vars-{kernel.release}-{key}.fd"
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        p7 = Path(tmp) / "vmlinuz.p7"
        p7.write_bytes(pe_signature(kernel.vmlinuz.read_bytes()))
        signer = Path(tmp) / "kernel-signer.pem"
        runner.run(["openssl", "pkcs7", "-inform", "DER", "-in", p7, "-print_certs", "-out", signer])
        out = Path(tmp) / "vars.fd"
        runner.run([_virt_fw_vars(), "--input", OVMF_VARS, "--output", out,
                    "--enroll-generate", "nodeprep smoke test", "--no-microsoft",
                    "--add-db", SB_OWNER_GUID, signer, "--add-db", SB_OWNER_GUID, trusted_cert,
                    "--secure-boot"])
        os.replace(out, dest)
    return dest


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
    mods = {initramfs.module_name(p.name): p for p in paths}
    infos = {name: read_kmod(p) for name, p in mods.items()}
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
    plan = initramfs.InitPlan(load=order, files=files, stop_after=[n for n in order if n not in infos])
    lines: list[str] = []
    timed_out = False
    with tempfile.TemporaryDirectory(prefix="nodeprep-smoke-") as tmp:
        t0 = time.monotonic()
        image = initramfs.build_initramfs(Path(tmp) / "initramfs.cpio", busybox, initramfs.render_init(plan),
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


def vermagic_mismatch(infos: Iterable[KmodInfo], kernel_release: str) -> str | None:
    """"vermagic <release> of <module> is not kernel <release>" for the first module built for
    another kernel release (with CONFIG_MODVERSIONS the kernel compares CRCs, not the release, so it
    may load such a module; nodeprep ships a module only for the exact release it was built for)."""
    for info in sorted(infos, key=lambda i: i.name):
        built_for = info.vermagic.split(" ", 1)[0]
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


def split_boot_static(infos: Mapping[str, KmodInfo]) -> tuple[list[str], list[str]]:
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


def _closure(name: str, infos: Mapping[str, KmodInfo],
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
        if manifest.kind != "kmod" or not manifest.kernel_release:
            raise InputError(f"{path}: not a kmod artifact (kind {manifest.kind})")
        release = kernel_release or manifest.kernel_release
        if release != manifest.kernel_release and not force:
            raise InputError(f"{path}: built for kernel {manifest.kernel_release}, not {release} "
                             "(add --force to boot it there anyway)")
        module_dir = Path(tmp) / "modules" / manifest.kernel_release
        if not module_dir.is_dir():
            raise ArtifactError(f"{path}: no modules/{manifest.kernel_release}/ in the artifact")
        return smoke_test_modules(module_dir, release, archive=archive, cache=cache, sig_enforce=sig_enforce,
                                  timeout=timeout, console_log=console_log, trusted_cert=trusted_cert)
