"""Node driver commands: install, activate, rollback, list, remove, uninstall, doctor, load-modules.
Thin: parse options, call nodeprep.node, render (text on stderr via logging, --json on stdout)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import click

from ..errors import InputError
from ..join.activation import CALLBACKS
from ..node import kernelevents, oplog, preview
from ..node.devices import load_modules
from ..node.doctor import ALL_CHECKS, doctor
from ..node.driverplan import ActivatePlan, InstallPlan, UninstallPlan
from ..node.driververbs import (
    FILE_FIELDS,
    DriverActivate,
    DriverInstall,
    Planned,
    Uninstall,
    activate_driver,
    install_driver,
    uninstall_node,
)
from ..node.installer import InstallResult
from ..node.inventory import inventory, kmod_flavour, render
from ..node.switch import ActivateResult
from ..node.versions import remove
from ..profile.model import Driver
from ..runtime.hookaudit import inheriting_hooks
from ..vocab import DEFAULT_MODULES, KERNEL_MODULES
from .clioptions import (
    check_option,
    emit_json,
    json_option,
    no_load_option,
    node_options,
    override_options,
    pop_overrides,
    root_option,
    section_flags,
)
from .defaults import node_driver, node_profile

log = logging.getLogger("nodeprep")


def _modules(value: str) -> tuple[str, ...]:
    names = tuple(m.strip() for m in value.split(",") if m.strip())
    bad = [m for m in names if m not in KERNEL_MODULES]
    if bad or not names or names[0] != "nvidia":
        raise InputError(
            f"--modules: {value!r} must start with nvidia and list only {', '.join(KERNEL_MODULES)}"
        )
    return names


def _driver(root: Path, profile: Path | None, overrides: dict[str, Any]) -> Driver:
    """The typed Driver section of the profile with the flags over it (--modules as the command line
    spells it, a comma list, parsed here)."""
    if overrides.get("driver.modules") is not None:  # --modules given: exactly that load order
        overrides = {**overrides, "driver.modules": _modules(overrides["driver.modules"]),
                     "driver.gpudirect": ()}
    store = overrides.get("driver.store")
    if store and "://" not in store and not store.startswith("/"):  # a directory of the command line's
        overrides = {**overrides, "driver.store": os.path.abspath(store)}  # cwd; the profile's is absolute
    return node_driver(root, profile, overrides)


def _activation_changes(result: ActivateResult | None) -> list[str]:
    if result is None or not result.changed:
        return []
    return [f"activated {result.version} (previous: {result.previous or 'none'})"]


def _install_changes(root: Path, result: InstallResult) -> list[str]:
    """What an install changed, for the node operation log (nodeprep.node.oplog)."""
    changes = []
    if result.changed:
        flavour = kmod_flavour(root, result.version, result.kernel) or "unknown flavour"
        what = "installed" if result.installed_userspace else "added the kernel modules of"
        changes.append(f"{what} {result.version} for kernel {result.kernel} ({flavour})")
    return changes + _activation_changes(result.activation)


def _print_notes(notes: tuple[str, ...]) -> None:
    for note in notes:
        click.echo(note, err=True)


@click.command("install")
@override_options(*section_flags("driver"))  # every driver field with a flag: a new one appears here
@click.option("--arch", default="amd64", show_default=True)
@click.option("--activate", "do_activate", is_flag=True, help="Activate the version after installing it.")
@click.option(
    "--no-load", is_flag=True, help="Do not load the kernel modules now (the unit loads them at boot)."
)
@check_option("Print what would change (the plan) and change nothing; no artifact is fetched.",
              dest="check_only")
@click.option(
    "--node-store", default=None, metavar="DIR|URL",
    help="The store the booted node will reach, recorded for the kernel hook instead of --store "
    "(needed with --root when --store is a directory of this machine, not of the image).",
)
@node_options
def install_cmd(
    arch: str,
    do_activate: bool,
    no_load: bool,
    check_only: bool,
    node_store: str | None,
    profile: Path | None,
    root: Path,
    as_json: bool,
    **overrides: Any,
) -> None:
    """Install a driver version from a store into /opt/nvidia/VERSION (side by side). Settings not
    given come from the profile's driver section (--profile, else /etc/nodeprep/node.yaml under
    --root when it exists); with --gpus, the version and flavour follow the GPUs, with --branch the
    version is one of that branch. --registry-auth and --ca-file name files of this machine (as
    --store does); the profile's name the node's, read beneath --root."""
    given = pop_overrides(overrides)
    if given["driver.gpus"] is not None and given["driver.version"] is not None:
        raise InputError("--gpus chooses the driver version: not with --driver")
    request = DriverInstall(
        _driver(root, profile, given), arch=arch, activate=do_activate, load=not no_load, check=check_only,
        node_store=node_store,
        host_files=frozenset(k for k in FILE_FIELDS if given[f"driver.{k}"] is not None),
    )
    result = install_driver(root, request, callbacks=CALLBACKS)
    if isinstance(result, Planned):
        if as_json:
            emit_json(result.plan.to_dict())
        else:
            _print_plan(result.plan)
        return
    oplog.record(root, "install", _install_changes(root, result))
    if as_json:
        emit_json(result.to_dict())
        return
    if result.changed:
        what = "installed" if result.installed_userspace else "added kernel modules to"
        click.echo(f"{what} {result.version} for kernel {result.kernel}", err=True)
    else:
        click.echo(f"unchanged: {result.version} for kernel {result.kernel} is already installed", err=True)
    _print_notes(tuple(n for n in result.notes if not n.endswith("is already installed")))
    if result.activation:
        _print_activation(result.activation)


def _print_plan(todo: InstallPlan) -> None:
    version, kernel = todo.request.version, todo.request.kernel
    if todo.new_version:
        assert todo.userspace is not None and todo.kmod is not None
        click.echo(f"would install {version} for kernel {kernel} ({todo.userspace.name}, {todo.kmod.name})")
    elif todo.kmod is not None:
        click.echo(f"would add the kernel modules of {version} for kernel {kernel} ({todo.kmod.name})")
    else:
        click.echo(f"unchanged: {version} for kernel {kernel} is already installed")
    act = todo.activation
    if act is not None and act.switch:
        click.echo(f"would activate {version} (active now: {act.active or 'none'})")
    elif act is not None:
        click.echo(f"{version} is already active")
    for path in act.drift if act else ():
        click.echo(f"would rewrite {path}")
    hook = todo.kernel_hook
    for path in hook.write if hook else ():
        click.echo(f"would write the kernel hook {path}")
    if hook is not None and not hook.recorded:
        click.echo("would record the kernel hook's store and options in state.json")
    _print_notes(tuple(n for n in todo.notes if not n.endswith("(the store was not read)")))
    if not todo.changes:
        click.echo("nothing to do")


def _print_activation(result: ActivateResult) -> None:
    if result.changed:
        click.echo(f"active: {result.version} (previous: {result.previous or 'none'})", err=True)
    _print_notes(result.notes)


def _print_activation_plan(act: ActivatePlan, as_json: bool) -> None:
    if as_json:
        emit_json(act.to_dict())
        return
    if act.switch:
        click.echo(f"would activate {act.version} (active now: {act.active or 'none'})")
    else:
        click.echo(f"{act.version} is already active")
    for path in act.drift:
        click.echo(f"would rewrite {path}")
    if not act.changes:
        click.echo("nothing to do")


def _activate(root: Path, request: DriverActivate, as_json: bool, verb: str) -> None:
    result = activate_driver(root, request, callbacks=CALLBACKS)
    if isinstance(result, ActivatePlan):
        _print_activation_plan(result, as_json)
        return
    oplog.record(root, verb, _activation_changes(result))
    if as_json:
        emit_json(result.to_dict())
    else:
        _print_activation(result)


@click.command("activate")
@click.argument("version", required=False)
@override_options("driver.kernel")
@no_load_option
@check_option("Print what activating VERSION would change and change nothing.")
@override_options("driver.modules")
@node_options
def activate_cmd(
    version: str | None, no_load: bool, check: bool, profile: Path | None, root: Path, as_json: bool,
    **overrides: Any,
) -> None:
    """Make an installed VERSION (default: driver.version of the profile) the active driver (atomic
    switch of /opt/nvidia/current)."""
    driver = _driver(root, profile, {"driver.version": version, **pop_overrides(overrides)})
    if driver.version is None:
        raise InputError("missing (give it or set driver.version in the profile)", field="driver.version",
                         flag="VERSION")
    request = DriverActivate(driver, driver.version, load=not no_load, check=check)
    _activate(root, request, as_json, "activate")


@click.command("rollback")
@no_load_option
@check_option("Print what the rollback would change and change nothing.")
@override_options("driver.modules")
@node_options
def rollback_cmd(no_load: bool, check: bool, profile: Path | None, root: Path, as_json: bool,
                 **overrides: Any) -> None:
    """Activate the previously active driver version."""
    driver = _driver(root, profile, pop_overrides(overrides))
    _activate(root, DriverActivate(driver, None, load=not no_load, check=check), as_json, "rollback")


@click.command("list")
@node_options
def list_cmd(profile: Path | None, root: Path, as_json: bool) -> None:
    """Installed driver versions (* active, < previous): size, install time, kernels and their
    module flavour; --json adds what doctor works from."""
    if profile is not None:  # uses none of its fields; a profile given is checked as everywhere
        node_profile(root, profile)
    doc = inventory(root)
    if as_json:
        emit_json(doc)
        return
    if not doc["installed"]:
        click.echo("no NVIDIA driver installed by nodeprep")
        return
    for line in render(doc):
        click.echo(line)


@click.command("remove")
@click.argument("version")
@check_option("Print whether VERSION would be removed and change nothing.")
@node_options
def remove_cmd(version: str, check: bool, profile: Path | None, root: Path, as_json: bool) -> None:
    """Delete an installed, inactive driver VERSION (only what nodeprep installed)."""
    if profile is not None:  # uses none of its fields; a profile given is checked as everywhere
        node_profile(root, profile)
    if check:
        todo = preview.removal(root, version)
        if as_json:
            emit_json(todo.to_dict())
        else:
            click.echo(f"would remove {version}" if todo.remove else f"unchanged: {version} is not installed")
        return
    result = remove(root, version)
    oplog.record(root, "remove", [f"removed {version}"] if result.changed else [])
    if as_json:
        emit_json(result.to_dict())
    elif result.changed:
        click.echo(f"removed {version}", err=True)
    else:
        click.echo(f"unchanged: {version} is not installed", err=True)


@click.command("uninstall")
@check_option("Print every path the uninstall would remove or write back, and change nothing.")
@root_option
@json_option
def uninstall_cmd(check: bool, root: Path, as_json: bool) -> None:
    """Return the node to what it was before nodeprep: every driver version, `current`, the unit,
    the kernel hooks, ld.so.conf.d and modprobe.d entries, entry points, the containerd drop-in and
    CDI spec nodeprep wrote (only files nodeprep made; any other is left and named)."""
    live = root.resolve() == Path("/")
    done = uninstall_node(root, Uninstall(check=check), callbacks=CALLBACKS)
    if isinstance(done, UninstallPlan):
        todo = done
        if as_json:
            emit_json(todo.to_dict(live))
            return
        for path in todo.restore:
            click.echo(f"would write back {path}")
        for path in (*todo.remove, *todo.after):
            click.echo(f"would remove {path}")
        for line in todo.kept:
            click.echo(f"would leave {line}")
        for argv in todo.commands(live):
            click.echo(f"would run {' '.join(argv)}")
        for line in todo.notes(live):
            click.echo(line)
        if not todo.changes:
            click.echo("nothing to do")
        return
    result = done
    oplog.record(root, "uninstall", [f"wrote back {p}" for p in result.restored]
                 + [f"removed {p}" for p in result.removed])
    for line in result.kept:
        log.warning("warning: %s", line)
    if as_json:
        emit_json(result.to_dict())
        return
    if result.changed:
        click.echo(f"uninstalled: {len(result.removed)} path(s) removed, {len(result.restored)} written back",
                   err=True)
    else:
        click.echo("unchanged: nothing of nodeprep's on this node", err=True)
    _print_notes(result.notes)


@click.command("doctor")
@click.option(
    "--require-cuda",
    default=None,
    metavar="X.Y|EXPR",
    help="Fail unless the active driver runs CUDA X.Y, or meets an NVIDIA_REQUIRE_CUDA expression "
    "such as 'cuda>=12.2 brand=tesla,driver>=470,driver<471'.",
)
@click.option(
    "--check", "only", multiple=True, type=click.Choice(ALL_CHECKS), help="Run only this check (repeatable)."
)
@click.option(
    "--expect-version", default=None, metavar="VERSION", help="Fail unless VERSION is the active driver."
)
@node_options
def doctor_cmd(
    require_cuda: str | None, only: tuple[str, ...], expect_version: str | None, profile: Path | None,
    root: Path, as_json: bool
) -> None:
    """Check the active driver (loaded module vs user space, device nodes, ld cache, CUDA) and the
    node's container hooks."""
    if profile is not None:  # uses none of its fields; a profile given is checked as everywhere
        node_profile(root, profile)
    report = doctor(root, require_cuda=require_cuda, checks=set(only) or None, expect_version=expect_version,
                    inheriting_hooks=inheriting_hooks)
    if as_json:
        emit_json(report.to_dict())
    else:
        click.echo(report.render())
    if not report.ok:
        raise SystemExit(1)


@click.command("load-modules")
@override_options("driver.modules")
@json_option
def load_modules_cmd(as_json: bool, **overrides: Any) -> None:
    """Load the active driver's modules and create /dev/nvidia* (run by nodeprep-nvidia.service)."""
    modules = pop_overrides(overrides)["driver.modules"] or ",".join(DEFAULT_MODULES)

    made = load_modules(_modules(modules))
    if as_json:
        emit_json({"modules": list(_modules(modules)), "created": made})
    else:
        click.echo(f"loaded {modules}; created {', '.join(made) or 'no new device nodes'}", err=True)


@click.command("kernel-hook")
@click.argument("event", type=click.Choice(["postinst", "postrm"]))
@click.argument("kernel")
@click.argument("image", required=False)
@root_option
@json_option
def kernel_hook_cmd(event: str, kernel: str, image: str | None, root: Path, as_json: bool) -> None:
    """Run by /etc/kernel/{postinst,postrm}.d/nodeprep for KERNEL: install (or, once removed, delete)
    the active driver's modules for it. Exit 1 with one line when the store has none for it."""
    if event == "postinst":
        result = kernelevents.kernel_installed(root, kernel, callbacks=CALLBACKS)
    else:
        result = kernelevents.kernel_removed(root, kernel)
    changes = [f"kernel {kernel}: {result.message}"] if result.changed else []
    oplog.record(root, f"kernel-hook {event}", changes)
    if as_json:
        emit_json(result.to_dict())
    else:
        click.echo(result.message, err=True)
    if not result.ok:
        raise SystemExit(1)


COMMANDS: list[click.Command] = [
    install_cmd, activate_cmd, rollback_cmd, list_cmd, remove_cmd, doctor_cmd, load_modules_cmd,
    kernel_hook_cmd, uninstall_cmd,
]
