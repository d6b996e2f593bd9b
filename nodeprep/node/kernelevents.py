"""What the kernel hooks run (`nodeprep kernel-hook postinst|postrm KERNEL`, written by
nodeprep/node/kernelhook.py): on postinst the active version's kmod for the new kernel through
`installer.install`, or the loud line and, with `keep_boot_kernel`, the GRUB drop-in that keeps the boot
default on a kernel that has the driver; on postrm the removal of nodeprep's modules and links for a
kernel that is gone (docs/node.md, "Kernel updates").
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..atomicfile import atomic_write, fsync_dir
from ..errors import InputError, NodeprepError
from ..stores.oci import Options
from ..sysfs import read_bytes
from . import integration
from .callbacks import ActivationCallbacks
from .installer import InstallInput, install
from .kernelhook import HOLD_FILE, LOUD, KernelHookConfig
from .kmod import running_kernel
from .layout import Layout, check_kernel
from .lock import locked
from .state import load_state


@dataclass(frozen=True)
class KernelHookResult:
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
            data = json.loads(read_bytes(layout.kmod_dir(version, k) / "manifest.json", limit=16 << 20))
            flavour = data.get("flavour") if isinstance(data, dict) else None
        except (OSError, ValueError):
            continue
        if isinstance(flavour, str):
            return flavour
    return None


def kernel_installed(root: Path, kernel: str, *, callbacks: ActivationCallbacks) -> KernelHookResult:
    """postinst: put the active driver's modules for `kernel` in place (see the module docstring).
    `hooks`: passed on to installer.install, as every caller does (nodeprep.join.activation.CALLBACKS)."""
    layout = Layout(Path(root))
    check_kernel(kernel)
    if not _installed_kernel(layout, kernel):
        raise InputError(f"kernel {kernel}: not installed under {layout.root} "
                         f"(no /lib/modules/{kernel}/kernel); "
                         "the hook takes the release of an installed kernel")
    state = load_state(layout.root)
    config = KernelHookConfig.from_dict(state.kernel_hook)
    version = state.active
    if config is None or version is None:
        why = "no store recorded by nodeprep install" if config is None else "no active NVIDIA driver"
        return KernelHookResult("postinst", kernel, version,
                                message=f"nodeprep kernel hook: {why}; nothing to do")
    have = state.installed[version].kernels
    if kernel in have:
        hold = release_hold(layout, have)
        return KernelHookResult("postinst", kernel, version, changed=hold is not None,
                          boot_hold=_node(layout, hold),
                          message=f"nodeprep kernel hook: {version} already has modules for {kernel}")
    try:
        options = Options(registry_auth=config.registry_auth, ca_file=config.ca_file,
                          insecure_http=config.insecure_http)
        install(layout.root, InstallInput(config.store, version, kernel=kernel, arch=config.arch,
                                          flavour=_flavour(layout, version, have), kernel_hook=False,
                                          store_options=options), callbacks=callbacks)
    except NodeprepError as e:
        return _missing(layout, kernel, version, have, config, str(e))
    hold = release_hold(layout, (*have, kernel))
    return KernelHookResult("postinst", kernel, version, changed=True, boot_hold=_node(layout, hold),
                      message=f"nodeprep kernel hook: installed the NVIDIA {version} modules "
                      f"for kernel {kernel}"
                      + (f" (removed {_node(layout, hold)}: the boot default is the newest kernel again)"
                         if hold else ""))


def _missing(layout: Layout, kernel: str, version: str, have: tuple[str, ...], config: KernelHookConfig,
             reason: str) -> KernelHookResult:
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
    return KernelHookResult("postinst", kernel, version, ok=False, message=message,
                            boot_hold=_node(layout, hold))


def _node(layout: Layout, path: Path | None) -> str | None:
    return layout.node_path(path) if path else None


def kernel_removed(root: Path, kernel: str) -> KernelHookResult:
    """postrm: delete every version's modules for `kernel` and their links, once the kernel is gone."""
    layout = Layout(Path(root))
    check_kernel(kernel)
    if _installed_kernel(layout, kernel):
        return KernelHookResult("postrm", kernel, message=f"nodeprep kernel hook: kernel {kernel} is still "
                          "installed; its NVIDIA modules stay")
    removed: list[str] = []
    with locked(layout):
        state = load_state(layout.root)
        if integration.unlink_modules(layout, [kernel]):
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
    return KernelHookResult("postrm", kernel, changed=bool(removed), message=message, removed=tuple(removed))
