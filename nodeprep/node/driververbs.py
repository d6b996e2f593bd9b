"""The driver verbs, one use case each: install a driver, activate one, roll back, uninstall. `nodeprep
install|activate|rollback|uninstall`, bootstrap's driver step and nodeprep.fleet.nodeprep_driver each make one
request (the profile's typed Driver section plus what the verb adds) and call the same function,
which owns every decision: the version (driver.branch / driver.gpus: node/branch.py), the kernel,
where the store's credential and CA files are read (the node's files, beneath --root), plan or apply."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..profile.fields import FIELDS, field_error
from ..profile.model import Driver
from ..rootpath import beneath
from ..stores.oci import Options as StoreOptions
from ..stores.store import Store
from .callbacks import ActivationCallbacks
from .driverplan import ActivatePlan, InstallPlan, UninstallPlan
from .installer import InstallInput, InstallResult, install, plan_install_of
from .preview import activation
from .state import State
from .switch import ActivateResult, activate, rollback
from .uninstall import UninstallResult, plan_uninstall_of, uninstall

# Driver fields that name a file the store client reads (the field table's `file`)
FILE_FIELDS = tuple(f.key for f in FIELDS if f.section == "driver" and f.file)


@dataclass(frozen=True)
class DriverInstall:
    """Install (and with `activate`, activate) the driver the profile's `driver` section names.
    `check`: plan only, nothing fetched or written. `sys_dir`: where driver.gpus 'node' reads the PCI
    devices (None: ROOT/sys). `image_kernel`: without driver.kernel, an image root's one kernel
    (bootstrap; the other front-ends refuse). `host_files`: FILE_FIELDS given as files of the machine
    running nodeprep (a command-line flag, like --store), read as named; every other path of
    `driver` names a file on the node, read beneath the root."""

    driver: Driver
    arch: str = "amd64"
    activate: bool = False
    load: bool = True
    check: bool = False
    node_store: str | None = None
    sys_dir: Path | None = None
    image_kernel: bool = False
    host_files: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Planned:
    """An install's plan (check mode): the node's state now and what would change."""

    before: State
    plan: InstallPlan

    @property
    def version(self) -> str:
        return self.plan.request.version


def _live(root: Path) -> bool:
    return os.path.realpath(root) == "/"


def node_file(root: Path, path: str | None) -> str | None:
    """A file the profile names (as the node sees it) on this machine: beneath `root`, its links
    resolved inside it; on a live root the path as named."""
    if not path or _live(root):
        return path
    return str(beneath(root, path))


def store_options(root: Path, request: DriverInstall) -> StoreOptions:
    """How the store is reached: its credential and CA files beneath the root unless given as this
    machine's (request.host_files)."""
    drv = request.driver

    def where(name: str, path: str | None) -> str | None:
        return path if name in request.host_files else node_file(root, path)

    return StoreOptions(registry_auth=where("registry_auth", drv.registry_auth),
                        ca_file=where("ca_file", drv.ca_file), insecure_http=drv.insecure_http)


def image_kernel(root: Path) -> str:
    """The one kernel installed in the image under `root` (ROOT/lib/modules/<release>)."""
    found = sorted({p.name for d in ("lib/modules", "usr/lib/modules") if (root / d).is_dir()
                    for p in (root / d).iterdir() if p.is_dir()})
    if len(found) != 1:
        raise field_error("driver.kernel", f"required with --root {root} (kernels in the image: "
                                           f"{', '.join(found) or 'none'})")
    return found[0]


def target_kernel(root: Path, request: DriverInstall) -> str | None:
    """driver.kernel; else None (the running kernel; with --root refused by node/kmod.py), or with
    `image_kernel` the image's one kernel."""
    kernel = request.driver.kernel
    if kernel or _live(root) or not request.image_kernel:
        return kernel
    return image_kernel(root)


def install_input(root: Path, request: DriverInstall) -> InstallInput:
    """The version, flavour and kernel to install and how to reach the store: driver.version, or the
    one driver.branch / driver.gpus choose from the store (node/branch.py)."""
    drv = request.driver
    if not drv.store:
        raise field_error("driver.store", "missing (give it or set driver.store in the profile)")
    options = store_options(root, request)
    kernel = target_kernel(root, request)
    version, flavour = drv.version, drv.flavour
    if drv.gpus is not None or drv.branch is not None:
        # lazy: Ansible nodeprep_driver
        from .branch import pick

        version, flavour = pick(Store(drv.store, options), root, version=drv.version, branch=drv.branch,
                                gpus=drv.gpus, kernel=kernel, flavour=drv.flavour, policy=drv.branch_policy,
                                arch=request.arch, sys_dir=request.sys_dir)
    if version is None:
        raise field_error("driver.version", "missing (give it or set driver.version in the profile)")
    return InstallInput(drv.store, version, kernel=kernel, flavour=flavour, arch=request.arch,
                        activate=request.activate, load=request.load, modules=drv.load_order,
                        daemons=drv.daemons, store_options=options, keep_boot_kernel=drv.keep_boot_kernel,
                        node_store=request.node_store)


def install_driver(root: Path, request: DriverInstall, *,
                   callbacks: ActivationCallbacks) -> Planned | InstallResult:
    """Install a driver: with request.check its plan (nothing fetched or written), else the install."""
    given = install_input(root, request)
    if request.check:
        return Planned(*plan_install_of(root, given))
    return install(root, given, callbacks=callbacks)


@dataclass(frozen=True)
class DriverActivate:
    """Make an installed version active (`version` None: roll back to the previous one)."""

    driver: Driver
    version: str | None
    load: bool = True
    check: bool = False


def activate_driver(root: Path, request: DriverActivate, *,
                    callbacks: ActivationCallbacks) -> ActivatePlan | ActivateResult:
    """Activate request.version (None: the previous one, a rollback); with request.check its plan."""
    drv, modules = request.driver, request.driver.load_order
    if request.check:
        return activation(root, request.version, kernel=drv.kernel if request.version else None,
                          modules=modules, daemons=drv.daemons)
    if request.version is None:
        return rollback(root, load=request.load, modules=modules, callbacks=callbacks, daemons=drv.daemons)
    return activate(root, request.version, kernel=drv.kernel, load=request.load, modules=modules,
                    callbacks=callbacks, daemons=drv.daemons)


@dataclass(frozen=True)
class Uninstall:
    """Return the node to what it was before nodeprep (`check`: the plan, nothing removed)."""

    check: bool = False


def uninstall_node(root: Path, request: Uninstall, *,
                   callbacks: ActivationCallbacks) -> UninstallPlan | UninstallResult:
    """Uninstall everything nodeprep made under `root`; with request.check its plan."""
    if request.check:
        return plan_uninstall_of(root, callbacks)
    return uninstall(root, callbacks=callbacks)
