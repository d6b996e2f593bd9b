"""click's own errors (missing or invalid options, unknown options and commands) as nodeprep's one
`error:` line, exit 2: `error: --driver: missing (give it or set driver.version in the profile)`."""

from __future__ import annotations

import click

from ..profile.fields import FIELDS


def _param_name(param: click.Parameter | None) -> str | None:
    if param is None:
        return None
    if isinstance(param, click.Option):
        return max(param.opts, key=len)
    return (param.human_readable_name or param.name or "").upper()


def _field_hint(flag: str | None) -> str:
    """` (give it or set FIELD in the profile)` for a flag that overrides a profile field."""
    paths = [f.path for f in FIELDS if flag is not None and f.flag == flag]
    return f" (give it or set {paths[0]} in the profile)" if paths else ""


def usage_line(e: click.UsageError) -> str:
    """One line for a click usage error, naming the option (its long spelling) first."""
    if isinstance(e, click.MissingParameter):
        name = _param_name(e.param)
        return f"{name}: missing{_field_hint(name)}"
    if isinstance(e, click.NoSuchOption):
        near = f" (did you mean {', '.join(e.possibilities)}?)" if e.possibilities else ""
        return f"{e.option_name}: no such option{near}"
    if isinstance(e, click.BadOptionUsage):
        return f"{e.option_name}: {e.message}"
    if isinstance(e, click.BadParameter):
        hint = _param_name(e.param) or e.param_hint
        return f"{hint}: {e.message}" if hint else e.message
    return e.message
