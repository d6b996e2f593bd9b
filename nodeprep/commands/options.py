"""Options shared by several commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

root_option = click.option(
    "--root", type=click.Path(file_okay=False, path_type=Path), default=Path("/"), show_default=True,
    help="Operate on the system mounted at DIR (chroot, image) instead of /.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary only.")
profile_option = click.option(
    "--profile", type=click.Path(dir_okay=False, path_type=Path), default=None,
    help="Node profile (default /etc/nodeprep/node.yaml under --root when it exists).",
)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))
