"""profile commands (see nodeprep/cli.py): `nodeprep profile check`, `nodeprep profile schema`."""

from __future__ import annotations

from pathlib import Path

import click

from ..profile import load_profile, profile_path, render_schema
from .options import emit_json, json_option, profile_option, root_option


@click.group("profile")
def profile_group() -> None:
    """The node profile (docs/profile.md)."""


@profile_group.command("check")
@profile_option
@root_option
@json_option
def profile_check(profile: Path | None, root: Path, as_json: bool) -> None:
    """Validate the profile; print every problem as `field.path: message` (exit 2)."""
    prof = load_profile(profile_path(root, profile))
    if as_json:
        emit_json(prof.to_dict())
    else:
        click.echo(f"{prof.source}: ok")


@profile_group.command("schema")
def profile_schema() -> None:
    """Print the profile's JSON Schema."""
    click.echo(render_schema(), nl=False)


COMMANDS: list[click.Command] = [profile_group]
