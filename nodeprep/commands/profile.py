"""profile commands (see nodeprep/cli.py): `nodeprep profile check`, `nodeprep profile schema`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..errors import InputError
from ..node import branch, driververbs
from ..profile import load_profile, profile_path, render_schema
from ..stores.store import Store
from ..urls import redact_url
from .clioptions import emit_json, node_options


@click.group("profile")
def profile_group() -> None:
    """The node profile (docs/profile.md)."""


@profile_group.command("check")
@click.option(
    "--gpus", default=None, metavar="node|10de:DEVICE,...",
    help="Also refuse a driver.version (and flavour), or a driver.branch none of whose versions, whose "
    "supported-GPU list, read from driver.store, does not run these GPUs ('node': the PCI devices under "
    "--root).",
)
@node_options
def profile_check(gpus: str | None, profile: Path | None, root: Path, as_json: bool) -> None:
    """Validate the profile; print every problem as `field.path: message` (exit 2)."""
    prof = load_profile(profile_path(root, profile))
    if gpus is None and prof.driver.gpus not in (None, "node"):  # the profile's own list: GPUs known
        gpus = prof.driver.gpus
    if gpus is not None:
        _check_pinned(root, prof, gpus)
    if as_json:
        emit_json(prof.to_dict())
    else:
        click.echo(f"{prof.source}: ok")


def _check_pinned(root: Path, prof: Any, gpus: str) -> None:
    """nodeprep.node.branch.require_pinned for the profile's driver.version and `gpus`; without one,
    a version of driver.branch (any when unset) that runs them must be in the store (for
    driver.kernel when set, else for any kernel)."""
    d = prof.driver
    if not d.store:
        raise InputError("--gpus checks the driver against driver.store's lists: the profile sets no store")
    ids = branch.gpu_ids(root, gpus)
    store = Store(d.store, driververbs.store_options(root, driververbs.DriverInstall(d)))  # the node's files
    if d.version is None:
        if d.branch and not branch.branch_versions(store, d.branch, d.kernel):
            raise InputError(f"driver.branch: {d.branch} has no version in the store "
                             f"{redact_url(store.location)}")
        field = "driver.branch" if d.branch else "driver.gpus"
        choice = branch.choose_from_store(store, ids, d.kernel, policy=d.branch_policy, preferred=d.flavour,
                                          branch=d.branch, what=field)
        click.echo(f"{field}: {choice.version} ({choice.flavour}) runs {', '.join(ids)}", err=True)
    elif not branch.require_pinned(store, d.version, d.flavour, ids):
        click.echo(f"warning: {d.version} carries no supported-GPU list: the GPUs were not checked", err=True)


@profile_group.command("schema")
def profile_schema() -> None:
    """Print the profile's JSON Schema."""
    click.echo(render_schema(), nl=False)


COMMANDS: list[click.Command] = [profile_group]
