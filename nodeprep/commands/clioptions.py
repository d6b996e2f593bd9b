"""Options shared by several commands."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ..errors import InputError
from ..profile.fields import FIELDS, field_by_path

log = logging.getLogger("nodeprep")


def existing_root(ctx: click.Context, param: click.Parameter, value: Path) -> Path:
    """--root must name an existing directory: a typo never creates a tree, on any node command."""
    if not value.is_dir():
        what = "is not a directory" if value.exists() or value.is_symlink() else "does not exist"
        raise InputError(f"--root {value}: {what}", hint="nothing was changed; create the image's tree first")
    return value


root_option = click.option(
    "--root", type=click.Path(path_type=Path), default=Path("/"), show_default=True,
    callback=existing_root, help="Operate on the system mounted at DIR (chroot, image) instead of /.",
)
sysfs_root_option = click.option(
    "--sysfs-root", "sysfs_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Stands for /sys (PCI devices, the nvidia module, DMI); default: ROOT/sys, as doctor reads it.",
)


json_option = click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary only.")
profile_option = click.option(
    "--profile", type=click.Path(dir_okay=False, path_type=Path), default=None,
    help="Node profile (default /etc/nodeprep/node.yaml under --root when it exists).",
)


def path_option(
    *decls: str, help: str, directory: bool = False, exists: bool = False
) -> Callable[[Any], Any]:
    """An optional path option (default None): a file, or with `directory` a directory; with `exists`
    it must be there."""
    kind = click.Path(file_okay=not directory, dir_okay=directory, exists=exists, path_type=Path)
    return click.option(*decls, type=kind, default=None, help=help)


no_load_option = click.option("--no-load", is_flag=True, help="Do not load the kernel modules now.")


def stacked(*decorators: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The decorators as one, in the order listed: as if written one above the other (the first
    outermost), so `--help` shows their options in that order."""

    def decorate(f: Any) -> Any:
        for d in reversed(decorators):
            f = d(f)
        return f

    return decorate


node_options = stacked(profile_option, root_option, json_option)
"""--profile, --root, --json: the options of a command that reads this node's profile."""


_ALIAS_USED = "nodeprep.check_alias"


def check_option(help: str, *deprecated: str, dest: str = "check") -> Callable[[Any], Any]:
    """`--check`, the one spelling of "show the plan, change nothing" on every writing command, and
    the command's older spellings (`deprecated`) as hidden aliases that print one `warning:` line.
    An alias given on the command line is processed before a `--check` that is not (click's order),
    so the `--check` callback sees it."""

    def alias(ctx: click.Context, param: click.Parameter, value: bool) -> None:
        if value:
            log.warning("warning: %s is deprecated; use --check", param.opts[0])
            ctx.meta[_ALIAS_USED] = True

    def check(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
        return bool(value or ctx.meta.get(_ALIAS_USED))

    def decorate(f: Any) -> Any:
        for name in deprecated:
            f = click.option(name, is_flag=True, hidden=True, expose_value=False, callback=alias)(f)
        return click.option("--check", dest, is_flag=True, help=help, callback=check)(f)

    return decorate


def check_json_options(help: str, *deprecated: str) -> Callable[[Any], Any]:
    """check_option(help, *deprecated), then --json."""
    return stacked(check_option(help, *deprecated), json_option)


def registry_options(f: Any) -> Any:
    """--registry-auth, --ca-file, --insecure-http: how to reach an oci:// or https store."""
    f = click.option("--insecure-http", is_flag=True,
                     help="Allow plain http to a store (http://, oci://) that is not on loopback.")(f)
    f = click.option("--ca-file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
                     help="CA bundle (PEM) that signs the store's TLS certificate.")(f)
    f = click.option("--registry-auth", type=click.Path(dir_okay=False), default=None, metavar="FILE",
                     envvar="NODEPREP_REGISTRY_AUTH", show_envvar=True,
                     help="Docker-style config.json with the registry's credentials (mode 0600).")(f)
    return f


def store_options(registry_auth: str | None, ca_file: str | None, insecure_http: bool) -> Any:
    # lazy: labels --help
    from ..stores.oci import Options

    return Options(registry_auth=registry_auth, ca_file=ca_file, insecure_http=insecure_http)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def _flag_given(ctx: click.Context, param: click.Parameter, value: bool) -> bool | None:
    return True if value else None  # a flag not given leaves the profile's value


def _no_flag_given(ctx: click.Context, param: click.Parameter, value: bool) -> bool | None:
    return False if value else None  # `--no-X` (a field whose default is true): false, else the profile's


def override_options(*paths: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """click decorator: one option per field path, from the table's `flag`, `metavar` and `envvar`
    (default None = not given; a boolean field is a flag, an enum a choice). The command passes its
    kwargs through `pop_overrides()` and then `with_overrides()` or `section_with()` (`driver_with()`),
    which hold each value to its field's rule."""
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        for path in reversed(paths):
            f = field_by_path(path)
            if f.flag is None:
                raise ValueError(f"{path} has no command-line flag in nodeprep.profile.FIELDS")
            kind: dict[str, Any] = {"metavar": f.metavar}
            if f.schema.get("type") == "boolean":
                given = _no_flag_given if f.flag.startswith("--no-") else _flag_given
                kind = {"is_flag": True, "callback": given}
            elif "enum" in f.schema:
                kind = {"type": click.Choice(list(f.schema["enum"]))}
            elif f.schema.get("type") == "integer":  # the field's rule checks the range
                kind = {"metavar": f.metavar, "type": int}
            if f.envvar:
                kind.update(envvar=f.envvar, show_envvar=True)
            fn = click.option(f.flag, path.replace(".", "__"), default=None,
                              help=f"{f.help} (overrides {path})", **kind)(fn)
        return fn

    return decorate


def section_flags(section: str) -> tuple[str, ...]:
    """The field paths of `section` that have a command-line flag, in the table's order."""
    return tuple(f.path for f in FIELDS if f.section == section and f.flag is not None)


def pop_overrides(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Remove the override_options() values from a command's kwargs; return them by field path."""
    return {k.replace("__", "."): kwargs.pop(k) for k in list(kwargs) if "__" in k}
