"""A new kernel never boots without its driver: Debian kernel hooks (/etc/kernel/postinst.d and
postrm.d) that `install` writes, and what they run (`nodeprep kernel-hook postinst|postrm KERNEL`).

`install` records in state.json (`kernel_hook`) where the driver came from (store, arch, store
options) and whether to keep the boot default; the active version and its flavour are read from the
filesystem when the hook runs. On a kernel package's postinst the hook installs the active version's
kmod for that kernel through `ops.install`, exactly as `nodeprep install --kernel` would. When that
fails (no artifact, store gone) it says so in one line and, with `keep_boot_kernel`, writes a GRUB
drop-in that keeps the boot default on a kernel that has the driver. The hook script itself always
exits 0: a failing postinst.d hook leaves the kernel package half-configured and apt broken.
On postrm it deletes nodeprep's modules and links for a kernel that is gone.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import download
from ..errors import InputError, NodeprepError
from ..stores import is_oci
from .fsutil import atomic_write, fsync_dir
from .hooks import ActivationHooks
from .kmod import running_kernel
from .layout import Layout, check_kernel
from .lock import locked
from .state import load_state

log = logging.getLogger(__name__)

HOOK_NAME = "nodeprep"  # runs after dkms and initramfs-tools, before zz-update-grub (run-parts order)
EVENTS = ("postinst", "postrm")
HOLD_FILE = "etc/default/grub.d/zz-nodeprep-keep-kernel.cfg"  # sourced by Debian's grub-mkconfig
LOUD = "nodeprep kernel hook: NO NVIDIA DRIVER FOR KERNEL"


@dataclass(frozen=True)
class HookConfig:
    """What the hook needs besides the filesystem; node paths (as the node sees them)."""

    store: str
    arch: str = "amd64"
    registry_auth: str | None = None
    ca_file: str | None = None
    insecure_http: bool = False
    keep_boot_kernel: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: Any) -> HookConfig | None:
        if not isinstance(data, dict) or not isinstance(data.get("store"), str):
            return None
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


@dataclass(frozen=True)
class HookResult:
    event: str
    kernel: str
    version: str | None = None
    changed: bool = False
    ok: bool = True  # False: the kernel has no modules of the active driver (`message` is the loud line)
    message: str = ""
    boot_hold: str | None = None  # node path of the GRUB drop-in written (or removed) by this run
    removed: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "event": self.event, "kernel": self.kernel, "version": self.version, "changed": self.changed,
            "ok": self.ok, "message": self.message, "boot_hold": self.boot_hold,
            "removed": list(self.removed),
        }


# --- recording (at install time) -------------------------------------------------------------


def node_view(layout: Layout, location: str | None) -> str | None:
    """A store or file as the node will see it: a local path under ROOT loses the ROOT prefix."""
    if not location or is_oci(location) or (local := download.local_path(location)) is None:
        return location
    try:
        return "/" + Path(os.path.abspath(local)).relative_to(os.path.abspath(layout.root)).as_posix()
    except ValueError:
        return location


def node_store(layout: Layout, store: str, given: str | None) -> str | None:
    """The store to record for the kernel hook: `given` (--node-store: what the booted node will
    reach), else `store` as the node sees it; None when that is a directory of the machine running
    nodeprep and not of the image under ROOT (a relative path, or one outside ROOT), which the
    booted node would not have."""
    if given:
        return given
    seen = node_view(layout, store)
    if layout.live or seen is None or is_oci(seen) or download.local_path(seen) is None:
        return seen
    return seen if seen.startswith("/") and local_inside(layout, store) else None


def local_inside(layout: Layout, location: str) -> bool:
    local = download.local_path(location)
    return local is not None and Path(os.path.abspath(local)).is_relative_to(os.path.abspath(layout.root))


def unrecorded_note(store: str) -> str:
    return (f"kernel hook: the store {store} is a directory of this machine, not of the image, so it is not "
            "recorded; give --node-store with the store the booted node will reach (docs/node.md, "
            "\"Kernel updates\")")


def keep_record(active: str | None, recorded: dict[str, Any] | None, version: str, activate: bool) -> bool:
    """True when installing `version` must leave the recorded store alone: another version is active
    and stays so, and its kernel modules come from the store already recorded, not from this one."""
    return recorded is not None and active not in (None, version) and not activate


def hook_path(layout: Layout, event: str) -> Path:
    return layout.resolved(f"/etc/kernel/{event}.d") / HOOK_NAME


def render_hook(command: str, event: str) -> str:
    """The hook script: calls nodeprep and always exits 0 (docs/node.md, "Kernel updates")."""
    exe = shlex.split(command)[0]
    if event == "postinst":
        what = "installed, install the active NVIDIA driver's modules for it from the store"
        missing = f"{LOUD} $1: {exe} is not installed"
    else:
        what = "removed, delete nodeprep's NVIDIA modules for it"
        missing = f"nodeprep kernel hook: kernel $1: {exe} is not installed"
    return f"""\
#!/bin/sh
# Written by nodeprep (nodeprep install): when a kernel package is {what}.
# Arguments: kernel release, image path (Debian kernel handbook, 8.1). Never fails the kernel
# package: a missing driver is one line on stderr, never a half-configured package.
exec </dev/null >&2
PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH"
case " ${{DEB_MAINT_PARAMS:-}} " in *abort*) exit 0 ;; esac
[ -n "${{1:-}}" ] || exit 0
if command -v {shlex.quote(exe)} >/dev/null 2>&1; then
    {command} kernel-hook {event} "$@" || true
else
    echo "{missing}"
fi
exit 0
"""


def _differs(path: Path, text: str) -> bool:
    try:
        return path.read_text() != text or (path.stat().st_mode & 0o7777) != 0o755
    except (OSError, UnicodeDecodeError):
        return True


def drift(layout: Layout, command: str) -> tuple[str, ...]:
    """Node paths of the hook scripts that are missing or differ from what write_hooks writes."""
    return tuple(layout.node_path(hook_path(layout, e)) for e in EVENTS
                 if _differs(hook_path(layout, e), render_hook(command, e)))


def write_hooks(layout: Layout, command: str) -> bool:
    changed = False
    for event in EVENTS:
        changed |= atomic_write(hook_path(layout, event), render_hook(command, event), mode=0o755)
    return changed


# --- the boot default ------------------------------------------------------------------------

_ENTRY_RE = re.compile(r"^\s*(menuentry|submenu)\s+'([^']*)'.*\$menuentry_id_option\s+'([^']*)'")


def grub_default(grub_cfg: str | None, kernel: str, os_name: str = "Debian GNU/Linux") -> str:
    """GRUB_DEFAULT for the normal (not recovery) entry of `kernel`: the menu entry ids of the node's
    grub.cfg (`submenu-id>entry-id`, what GRUB recommends) when it lists the kernel, else the title
    path grub-mkconfig generates on Debian ("Advanced options for OS>OS, with Linux KERNEL")."""
    wanted = re.compile(rf"^gnulinux-{re.escape(kernel)}-advanced-")
    stack: list[str | None] = []  # ids of the open blocks that are submenus
    for line in (grub_cfg or "").splitlines():
        m = _ENTRY_RE.match(line)
        if m and m.group(1) == "menuentry" and wanted.match(m.group(3)):
            return ">".join([s for s in stack if s] + [m.group(3)])
        if line.rstrip().endswith("{"):
            stack.append(m.group(3) if m and m.group(1) == "submenu" else None)
        elif line.strip() == "}" and stack:
            stack.pop()
    return f"Advanced options for {os_name}>{os_name}, with Linux {kernel}"


def render_hold(value: str, kernel: str, kept: str, version: str) -> str:
    return (
        f"# Written by nodeprep (kernel hook, driver.keep_boot_kernel): kernel {kernel} has no NVIDIA\n"
        f"# {version} modules in the store, so the boot default stays on {kept}, which has them.\n"
        f"# nodeprep removes this file once every installed kernel has them; to undo it by hand,\n"
        f"# delete it and run update-grub (docs/node.md, \"Kernel updates\").\n"
        f"GRUB_DEFAULT={shlex.quote(value)}\n"
    )


def _kernel_key(release: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", release))


def kernel_to_keep(layout: Layout, kernels: tuple[str, ...], new: str) -> str | None:
    """The kernel the node should keep booting: the running one when it has the driver's modules and
    an image under ROOT/boot, else the newest such kernel (a chroot runs the host's kernel)."""
    bootable = [k for k in kernels if k != new and (layout.resolved("/boot") / f"vmlinuz-{k}").exists()]
    running = running_kernel()
    if running in bootable:
        return running
    return max(bootable, key=_kernel_key, default=None)


def hold_boot(layout: Layout, kernel: str, kept: str, version: str) -> Path:
    grub_cfg = layout.resolved("/boot/grub/grub.cfg")
    text = grub_cfg.read_text(errors="replace") if grub_cfg.is_file() else None
    path = layout.host_path(HOLD_FILE)
    atomic_write(path, render_hold(grub_default(text, kept), kernel, kept, version))
    return path


def release_hold(layout: Layout, kernels: tuple[str, ...]) -> Path | None:
    """Remove the boot-default drop-in once every installed kernel (an image in ROOT/boot) has the
    driver's modules (`kernels`): until then the newest kernel may still be one without them."""
    path = layout.host_path(HOLD_FILE)
    images = (p.name.removeprefix("vmlinuz-") for p in layout.resolved("/boot").glob("vmlinuz-*"))
    lacking = [k for k in images if k not in kernels and _installed_kernel(layout, k)]
    if not path.exists() or lacking:
        return None
    path.unlink()
    fsync_dir(path.parent)
    return path


# --- the hook ----------------------------------------------------------------------------------


def _installed_kernel(layout: Layout, kernel: str) -> bool:
    return any(layout.resolved(f"/{d}/{kernel}/kernel").is_dir() for d in ("lib/modules", "usr/lib/modules"))


def _flavour(layout: Layout, version: str, kernels: tuple[str, ...]) -> str | None:
    for k in kernels:
        try:
            flavour = json.loads((layout.kmod_dir(version, k) / "manifest.json").read_text()).get("flavour")
        except (OSError, ValueError):
            continue
        if isinstance(flavour, str):
            return flavour
    return None


def kernel_installed(root: Path, kernel: str, *, hooks: ActivationHooks) -> HookResult:
    """postinst: put the active driver's modules for `kernel` in place (see the module docstring).
    `hooks`: passed on to ops.install, as every caller does (nodeprep.join.activation.HOOKS)."""
    layout = Layout(Path(root))
    check_kernel(kernel)
    if not _installed_kernel(layout, kernel):
        raise InputError(f"kernel {kernel}: not installed under {layout.root} "
                         f"(no /lib/modules/{kernel}/kernel); "
                         "the hook takes the release of an installed kernel")
    state = load_state(layout.root)
    config = HookConfig.from_dict(state.kernel_hook)
    version = state.active
    if config is None or version is None:
        why = "no store recorded by nodeprep install" if config is None else "no active NVIDIA driver"
        return HookResult("postinst", kernel, version, message=f"nodeprep kernel hook: {why}; nothing to do")
    have = state.installed[version].kernels
    if kernel in have:
        hold = release_hold(layout, have)
        return HookResult("postinst", kernel, version, changed=hold is not None,
                          boot_hold=_node(layout, hold),
                          message=f"nodeprep kernel hook: {version} already has modules for {kernel}")
    from ..stores.oci import Options
    from .ops import install  # ops records the hook: import at use

    try:
        install(layout.root, config.store, version, kernel=kernel, flavour=_flavour(layout, version, have),
                arch=config.arch, activate=False, kernel_hook=False, hooks=hooks,
                store_options=Options(registry_auth=config.registry_auth, ca_file=config.ca_file,
                                      insecure_http=config.insecure_http))
    except NodeprepError as e:
        return _missing(layout, kernel, version, have, config, str(e))
    hold = release_hold(layout, (*have, kernel))
    return HookResult("postinst", kernel, version, changed=True, boot_hold=_node(layout, hold),
                      message=f"nodeprep kernel hook: installed the NVIDIA {version} modules "
                      f"for kernel {kernel}"
                      + (f" (removed {_node(layout, hold)}: the boot default is the newest kernel again)"
                         if hold else ""))


def _missing(layout: Layout, kernel: str, version: str, have: tuple[str, ...], config: HookConfig,
             reason: str) -> HookResult:
    kept = kernel_to_keep(layout, have, kernel)
    hold = None
    if not config.keep_boot_kernel:
        after = (f"set driver.keep_boot_kernel to keep booting {kept}" if kept
                 else "no installed kernel has its modules")
    elif kept is None:
        after = "no installed kernel has its modules, so the boot default was left alone"
    else:
        hold = hold_boot(layout, kernel, kept, version)
        after = f"boot default kept on {kept} ({_node(layout, hold)})"
        if not layout.resolved("/etc/default/grub").exists():
            after += ", but GRUB is not installed here"
    message = f"{LOUD} {kernel}: {reason.splitlines()[0]}; it boots WITHOUT the GPU driver ({after})"
    return HookResult("postinst", kernel, version, ok=False, message=message, boot_hold=_node(layout, hold))


def _node(layout: Layout, path: Path | None) -> str | None:
    return layout.node_path(path) if path else None


def kernel_removed(root: Path, kernel: str) -> HookResult:
    """postrm: delete every version's modules for `kernel` and their links, once the kernel is gone."""
    from . import system

    layout = Layout(Path(root))
    check_kernel(kernel)
    if _installed_kernel(layout, kernel):
        return HookResult("postrm", kernel, message=f"nodeprep kernel hook: kernel {kernel} is still "
                          "installed; its NVIDIA modules stay")
    removed: list[str] = []
    with locked(layout):
        state = load_state(layout.root)
        if system.unlink_modules(layout, [kernel]):
            removed.append(layout.node_path(layout.module_links(kernel)))
        for version, entry in sorted(state.installed.items()):
            if kernel not in entry.kernels:
                continue
            kdir = layout.kmod_dir(version, kernel)
            doomed = kdir.parent / f".removing-{kernel}-{os.getpid()}"
            os.rename(kdir, doomed)
            fsync_dir(kdir.parent)
            shutil.rmtree(doomed)
            removed.append(layout.node_path(kdir))
        active = state.installed.get(state.active or "")
        hold = release_hold(layout, tuple(k for k in active.kernels if k != kernel)) if active else None
        if hold:  # the kernel that lacked the driver is gone
            removed.append(layout.node_path(hold))
    message = (f"nodeprep kernel hook: removed the NVIDIA modules of kernel {kernel} ({', '.join(removed)})"
               if removed else f"nodeprep kernel hook: no NVIDIA modules for kernel {kernel}")
    return HookResult("postrm", kernel, changed=bool(removed), message=message, removed=tuple(removed))
