"""The smoke boot's serial console read back: the initramfs's markers, insmod results, kernel
messages per module, crashes, and the verdict they add up to (`classify`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from . import initramfs

PROBE_MODULE = "nvidia"  # the one module whose load is expected to stop at the (missing) GPU
ENODEV_TEXT = "No such device"
NO_GPU_TEXT = "No NVIDIA GPU found"

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
