"""join's part of a driver activation (nodeprep.node.callbacks): the CDI specs nodeprep wrote follow
the new version, and a containerd runtime binary that went missing is reported.

The front-ends (CLI, bootstrap, the Ansible module) pass `CALLBACKS` to nodeprep.node's install,
activate and rollback. cdi and containerd are imported when an activation runs, not when this
module is imported: an install that activates nothing does not pay for them. `removal` is join's
part of `nodeprep uninstall` (nodeprep.join.removal).
"""

from __future__ import annotations

from pathlib import Path

from ..node.callbacks import ActivationCallbacks, FollowUp, Removal


def refusal(root: Path) -> str | None:
    """Why the specs could not follow the switch (checked before anything changes)."""
    # lazy: Ansible nodeprep_driver, Ansible nodeprep_upgrade, import nodeprep.join.activation
    from ..runtime.cdi import refresh_problem

    return refresh_problem(root)


def follow(root: Path, version: str) -> FollowUp:
    # lazy: Ansible nodeprep_driver, Ansible nodeprep_upgrade, import nodeprep.join.activation
    from ..runtime.cdi import refresh_after_activation
    from ..runtime.containerd import drop_in_runtime_warning

    rewritten = tuple(refresh_after_activation(root, version))
    notes = [f"{spec} now mounts {version}" for spec in rewritten]
    missing_runtime = drop_in_runtime_warning(root)
    if missing_runtime:
        notes.append(missing_runtime)
    return FollowUp(rewritten=rewritten, notes=tuple(notes))


def removal(root: Path) -> Removal:
    """What `nodeprep uninstall` undoes of `nodeprep runtime` and `nodeprep join` (nodeprep.join.removal)."""
    # lazy: Ansible nodeprep_driver, Ansible nodeprep_upgrade, import nodeprep.join.activation
    from .removal import plan_removal

    return plan_removal(root, join=True)


CALLBACKS = ActivationCallbacks(refusal=refusal, follow=follow, removal=removal)
