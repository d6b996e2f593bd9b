"""The `nodeprep` command line. Each concern's commands live in nodeprep/commands/<concern>.py and
export COMMANDS; this module only builds the group and translates errors into one line + exit code.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import click

from . import __version__
from .commands import bootstrap, build, health, install, join, labels, mig, profile, smoke, upgrade, verify
from .commands.usage import usage_line
from .errors import NodeprepError
from .log import setup_logging

log = logging.getLogger("nodeprep")

COMMAND_MODULES = (build, install, labels, join, profile, smoke, bootstrap, verify, mig, health, upgrade)


class NodeprepGroup(click.Group):
    """Runs a command and turns NodeprepError and click's usage errors into `error: ...` on stderr
    without a traceback."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as e:
            click.echo(f"error: {usage_line(e)}", err=True)
            raise click.exceptions.Exit(e.exit_code) from None

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            click.echo(f"error: {usage_line(e)}", err=True)
            ctx.exit(e.exit_code)
        except NodeprepError as e:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"error: {e}", err=True)
            if e.hint:
                for line in e.hint.splitlines():
                    click.echo(f"  {line}", err=True)
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("error: interrupted", err=True)
            ctx.exit(130)


@click.group(cls=NodeprepGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="nodeprep")
@click.option("-v", "--verbose", count=True, help="More output (commands run, their output).")
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors.")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.pass_context
def main(ctx: click.Context, verbose: int, quiet: bool, debug: bool) -> None:
    """Build NVIDIA drivers ahead of time, install them into versioned roots, label GPU nodes
    and join them to Kubernetes."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    setup_logging(verbose, quiet)


for _mod in COMMAND_MODULES:
    for _cmd in _mod.COMMANDS:
        main.add_command(_cmd)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
