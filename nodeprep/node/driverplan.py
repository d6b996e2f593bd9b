"""What install / activate / rollback / remove would change: pure plans over explicit inputs.

Each plan is computed from the node's `State` (what the root holds), the store's index entries
(only when something has to come from the store) and the request, and says what would change;
nodeprep.node.installer, switch, versions and uninstall apply it (under the lock, after planning
again there). `nodeprep install --check` and the Ansible modules' check mode print the same plan,
so a prediction and a run cannot disagree about what is missing. What the plan cannot know without
running (the GPUs a driver supports, a user space that fails the completeness proof, a CDI spec that
cannot be rewritten) is checked by the apply step before it changes anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..artifact import IndexEntry, find
from ..errors import InputError, StateError
from ..modinfo import parse_vermagic
from ..profile.fields import field_error
from ..vocab import version_key
from .kmod import vermagic_problem
from .state import Installed, State


@dataclass(frozen=True)
class InstallRequest:
    version: str
    kernel: str  # the target kernel release, already resolved (--kernel or the running one)
    flavour: str | None = None
    arch: str = "amd64"
    activate: bool = False


@dataclass(frozen=True)
class ActivatePlan:
    version: str
    active: str | None  # the active version before
    kernels: tuple[str, ...]  # kernels the version has modules for (after an install: with the new one)
    drift: tuple[str, ...] = ()  # node paths of files activation writes that differ from what it would write

    @property
    def switch(self) -> bool:
        return self.active != self.version

    @property
    def changes(self) -> bool:
        return self.switch or bool(self.drift)

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "active": self.active, "switch": self.switch,
                "kernels": list(self.kernels), "rewrite": list(self.drift)}


@dataclass(frozen=True)
class KernelHookPlan:
    """The kernel hook an install sets up (nodeprep.node.kernelhook): its record in state.json and
    the hook scripts under /etc/kernel."""

    record: dict[str, Any]  # state.json's kernel_hook after the install
    recorded: bool  # state.json records exactly that already
    write: tuple[str, ...] = ()  # node paths of hook scripts that are missing or differ

    @property
    def changes(self) -> bool:
        return not self.recorded or bool(self.write)

    def to_dict(self) -> dict[str, Any]:
        return {"record": self.record, "update_record": not self.recorded, "write": list(self.write)}


@dataclass(frozen=True)
class InstallPlan:
    request: InstallRequest
    userspace: IndexEntry | None  # the store's user space of the version (None: the index was not read)
    kmod: IndexEntry | None  # to unpack for request.kernel (None: already there)
    new_version: bool  # the version is not installed: unpack `userspace` and `kmod` into a new root
    activation: ActivatePlan | None
    notes: tuple[str, ...] = ()
    kernel_hook: KernelHookPlan | None = None  # None: the install sets up no kernel hook

    @property
    def changes(self) -> bool:
        return bool(self.new_version or self.kmod or (self.activation and self.activation.changes)
                    or (self.kernel_hook and self.kernel_hook.changes))

    def after(self, state: State) -> State:
        """The state this plan leaves behind (the Ansible diff's `after`)."""
        have = state.installed.get(self.request.version) or Installed(version=self.request.version)
        kernels = tuple(sorted(set(have.kernels) | {self.request.kernel}))
        installed = {**state.installed, self.request.version: replace(have, kernels=kernels)}
        hook = self.kernel_hook.record if self.kernel_hook else state.kernel_hook
        if self.activation is None or not self.activation.switch:
            return replace(state, installed=installed, kernel_hook=hook)
        return replace(state, installed=installed, kernel_hook=hook, active=self.request.version,
                       previous=state.active)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.request.version,
            "kernel": self.request.kernel,
            "changes": self.changes,
            "install_userspace": self.userspace.name if self.new_version and self.userspace else None,
            "install_kmod": self.kmod.name if self.kmod else None,
            "activation": self.activation.to_dict() if self.activation else None,
            "kernel_hook": self.kernel_hook.to_dict() if self.kernel_hook else None,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class RemovePlan:
    version: str
    remove: bool  # False: not installed, nothing to do

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "changes": self.remove}


def needs_index(state: State, version: str, kernel: str) -> bool:
    """Whether planning this install has to read the store's index: a version installed for the
    kernel needs nothing from the store (a re-run neither depends on it nor pays for asking it)."""
    have = state.installed.get(version)
    return have is None or kernel not in have.kernels


def plan_install(
    state: State, request: InstallRequest, entries: list[IndexEntry] | None, *,
    live_kernel: str | None = None, drift: tuple[str, ...] = (),
    kernel_hook: dict[str, Any] | None = None, kernel_hook_drift: tuple[str, ...] = (),
) -> InstallPlan:
    """The install of `request` on a node in `state` from a store with index `entries` (None when
    needs_index() said no). `live_kernel`: the running kernel of a live system; `drift`: files an
    activation would rewrite (system.drift); `kernel_hook`: the kernel hook's record to keep in
    state.json (None: no kernel hook), `kernel_hook_drift`: its scripts that are missing or differ
    (kernelhook.drift)."""
    version, kernel = request.version, request.kernel
    have = state.installed.get(version)
    notes: list[str] = []
    us = kmod = None
    if needs_index(state, version, kernel):
        if entries is None:
            raise ValueError("plan_install: the store's index is needed")  # a caller's bug
        us, kmod = pick(entries, request)
        if have is not None and have.input_digest != us.input_digest:
            notes.append(
                f"{version} is installed from another build (input digest "
                f"{have.input_digest[:12]}…, store has {us.input_digest[:12]}…); "
                f"remove it first to replace it"
            )
    else:
        notes.append(f"{version} for kernel {kernel} is already installed (the store was not read)")
    activation = None
    if request.activate:
        kernels = tuple(sorted(set(have.kernels if have else ()) | {kernel}))
        installed = {**state.installed, version: Installed(version=version, kernels=kernels)}
        after = replace(state, installed=installed)
        activation = plan_activate(after, version, kernel=None if live_kernel else kernel,
                                   live_kernel=live_kernel, drift=drift)
    hook = None if kernel_hook is None else KernelHookPlan(
        record=kernel_hook, recorded=state.kernel_hook == kernel_hook, write=kernel_hook_drift)
    return InstallPlan(request=request, userspace=us, kmod=kmod, new_version=have is None,
                       activation=activation, notes=tuple(notes), kernel_hook=hook)


def plan_activate(
    state: State, version: str, *, kernel: str | None = None, live_kernel: str | None = None,
    drift: tuple[str, ...] = (),
) -> ActivatePlan:
    """Making installed `version` active. `live_kernel`: the running kernel of a live system (the
    version must have modules for it); `kernel`: a kernel the caller asked modules for."""
    target = state.installed.get(version)
    if target is None:
        raise InputError(
            f"{version}: not installed (installed: "
            f"{', '.join(sorted(state.installed, key=version_key)) or 'none'})"
        )
    if live_kernel and live_kernel not in target.kernels:
        raise InputError(
            f"{version} has no kernel modules for the running kernel {live_kernel} "
            f"(it has: {', '.join(target.kernels) or 'none'}); "
            f"nodeprep install --driver {version} adds them"
        )
    if kernel and kernel not in target.kernels:
        raise InputError(
            f"{version} has no kernel modules for kernel {kernel} "
            f"(it has: {', '.join(target.kernels) or 'none'})"
        )
    return ActivatePlan(version=version, active=state.active, kernels=target.kernels, drift=drift)


def daemon_commands(unit: str, *, live: bool, loaded: bool, unit_changed: bool,
                          switched: bool) -> list[list[str]]:
    """The systemctl commands an activation runs for the daemon unit `unit` (persistenced, Fabric
    Manager; pure). Under
    --root none (the unit starts at boot); on a live root a daemon-reload when the unit changed, then,
    with the version's modules loaded, a restart after a switch or a new unit (the daemon runs the
    binary `current` names: the new one), else a start (nothing when it runs already). With another
    version's module still loaded, nothing: the new daemon would refuse the old module, and the
    restart of the module-load unit (or the reboot) the activation asks for restarts it too."""
    if not live:
        return []
    out = [["systemctl", "daemon-reload"]] if unit_changed else []
    if loaded:
        out.append(["systemctl", "restart" if switched or unit_changed else "start", unit])
    return out


def dropped_daemon_commands(unit: str, *, live: bool) -> list[list[str]]:
    """The systemctl commands when an activation removed the daemon unit `unit` (the profile turned
    it off; pure): on a live root stop it and reload systemd's units, under --root none."""
    return [["systemctl", "stop", unit], ["systemctl", "daemon-reload"]] if live else []


def rollback_target(state: State) -> str:
    """The version a rollback activates."""
    if not state.previous:
        raise StateError(
            "nothing to roll back to: no previously active version is installed",
            hint=f"installed: {', '.join(sorted(state.installed)) or 'none'}",
        )
    return state.previous


def plan_remove(state: State, version: str) -> RemovePlan:
    if version not in state.installed:
        return RemovePlan(version=version, remove=False)
    if version == state.active:
        raise InputError(
            f"{version} is the active driver; activate another version first "
            f"(nodeprep activate VERSION or nodeprep rollback)"
        )
    return RemovePlan(version=version, remove=True)


def pick(entries: list[IndexEntry], request: InstallRequest) -> tuple[IndexEntry, IndexEntry]:
    """(user-space entry, kmod entry) of the request from the store's index."""
    version, arch = request.version, request.arch
    us_entry = find(entries, "userspace", version, arch=arch)
    if us_entry is None:
        have = sorted({e.driver_version for e in entries if e.kind == "userspace"}, key=version_key)
        raise field_error(
            "driver.version", f"no user-space artifact for {version} ({arch}) in the store "
            f"(available: {', '.join(have) or 'none'})"
        )
    return us_entry, pick_kmod(entries, version, request.kernel, request.flavour)


def pick_kmod(entries: list[IndexEntry], version: str, kernel: str, flavour: str | None) -> IndexEntry:
    kmods = [
        e
        for e in entries
        if e.kind == "kmod" and e.driver_version == version and (flavour is None or e.flavour == flavour)
    ]
    exact = [e for e in kmods if e.kernel_release == kernel]
    if not exact:
        if kmods:
            others = ", ".join(sorted({str(e.kernel_release) for e in kmods}))
            raise InputError(
                f"driver {version}: the store's kmod artifacts are built for kernel {others}, "
                f"the target kernel is {kernel} (vermagic mismatch); build one for {kernel}"
            )
        raise InputError(
            f"driver {version}: no kmod artifact in the store" + (f" (flavour {flavour})" if flavour else "")
        )
    if len(exact) > 1 and flavour is None:
        flavours = ", ".join(sorted(str(e.flavour) for e in exact))
        raise field_error("driver.flavour", f"driver {version} for {kernel} exists as {flavours}; pick one")
    entry = exact[0]
    if entry.vermagic:
        problem = vermagic_problem(parse_vermagic(entry.vermagic), kernel)
        if problem:
            raise InputError(f"{entry.name}: {problem}")
    return entry



@dataclass(frozen=True)
class UninstallPlan:
    """What `uninstall` removes, in order (node paths; a folder after what it holds), the files it
    writes back (`restore`: nodeprep edited them), the files it leaves (`kept`: one line each, at a
    path nodeprep writes but not written by it), the modules it unloads first (live root), and what
    runs after: ldconfig, depmod for the kernels whose module links went, and on a live root a
    systemd daemon-reload and the restart of the units join names (containerd). On a live root the
    units join set up (`stop`: kubelet) are stopped first, when systemd says they are active."""

    remove: tuple[str, ...] = ()
    restore: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    unload: tuple[str, ...] = ()
    ldconfig: bool = False
    after: tuple[str, ...] = ()  # removed once ldconfig ran: the caches nodeprep's ldconfig made, its record
    depmod: tuple[str, ...] = ()
    daemon_reload: bool = False
    restart: tuple[str, ...] = ()
    stop: tuple[str, ...] = ()

    @property
    def changes(self) -> bool:
        return bool(self.remove or self.restore or self.unload or self.after)

    def commands(self, live: bool) -> list[list[str]]:
        """The commands the apply runs (as on a live root; under --root: ldconfig -r, depmod -b)."""
        out = [["systemctl", "stop", u] for u in self.stop] if live else []
        out += [["modprobe", "-r", *self.unload]] if self.unload else []
        out += [["ldconfig"]] if self.ldconfig else []
        out += [["depmod", k] for k in self.depmod]
        return out + (self.units_after() if live else [])

    def units_after(self) -> list[list[str]]:
        """The systemctl commands run last on a live root, once the files are gone."""
        return [["systemctl", "daemon-reload"]] * self.daemon_reload + [
            ["systemctl", "try-restart", u] for u in self.restart]

    def notes(self, live: bool) -> list[str]:
        """What the plan does to the running system beyond its commands, one line each."""
        says = ("stopped before its files go, only when systemd says it is active" if live
                else "not stopped: with --root, uninstall never touches the running system")
        return [f"{u}: {says}" for u in self.stop]

    def to_dict(self, live: bool = False) -> dict[str, Any]:
        return {"changes": self.changes, "remove": [*self.remove, *self.after], "restore": list(self.restore),
                "kept": list(self.kept), "commands": self.commands(live), "notes": self.notes(live)}


def plan_uninstall(remove: list[str], restore: list[str], kept: list[str], *, loaded: tuple[str, ...],
                   kernels: tuple[str, ...], restart: tuple[str, ...], ldconfig: bool,
                   unit: str, stop: tuple[str, ...] = (), after: Sequence[str] = (),
                   units: tuple[str, ...] = ()) -> UninstallPlan:
    """The uninstall of what the survey found: `remove` and `restore` (node paths, in order), `kept`
    (lines), the nvidia modules `loaded` now (live root), the `kernels` whose module links go, the
    units join asks to restart, and to `stop` first, whether the ld cache names what goes
    (`ldconfig`), the unit's node path (its removal needs a daemon-reload) and what goes once
    ldconfig ran (`after`); `units`: the node paths of nodeprep's other units (persistenced)."""
    return UninstallPlan(
        remove=tuple(remove), restore=tuple(restore), kept=tuple(kept), unload=loaded,
        ldconfig=ldconfig, after=tuple(after), depmod=kernels,
        daemon_reload=unit in remove or any(u in remove for u in units),
        restart=restart if remove or restore else (), stop=stop if remove or restore else ())
