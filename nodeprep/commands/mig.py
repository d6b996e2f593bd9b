"""`nodeprep mig`: the profile's MIG layout (mig.config, mig-parted's format) on this node's GPUs,
through NVML, before the device plugin sees them (docs/node.md "MIG layout")."""

from __future__ import annotations

from pathlib import Path

import click

from ..node.migapply import run
from ..profile import load_profile, profile_path
from .clioptions import check_option, emit_json, node_options


@click.command("mig")
@node_options
@check_option("Print the plan (MIG mode to set, MIG devices to destroy and create) and change nothing.")
def mig_cmd(profile: Path | None, root: Path, as_json: bool, check: bool) -> None:
    """Put mig.config's selected mig-config (mig.select) in place on this host's GPUs: MIG mode, then
    the MIG devices; nothing when it is in place. The GPUs are always this host's (NVML); --root is
    where the profile is read and the outcome recorded (var/lib/nodeprep/mig.json, read back by
    `labels` as nvidia.com/mig.config.state)."""
    prof = load_profile(profile_path(root, profile))
    result = run(root, prof.mig.config, prof.mig.select, check=check)
    if as_json:
        emit_json(result)
        return
    for line in result.get("plan", []):
        click.echo(("would: " if check and result.get("changes") else "") + line)
    for line in result.get("outcome", {}).get("done", []):
        click.echo(line)
    click.echo(result["summary"])


COMMANDS = [mig_cmd]
