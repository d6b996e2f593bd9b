"""One CliRunner for the in-process CLI tests."""

from __future__ import annotations

from click.testing import CliRunner


def separate_stderr() -> CliRunner:
    """A CliRunner whose results keep stderr apart from stdout (click < 8.2 needs mix_stderr=False;
    from 8.2 on that is the only behaviour and the argument is gone)."""
    try:
        return CliRunner(mix_stderr=False)  # type: ignore[call-arg]  # click < 8.2
    except TypeError:
        return CliRunner()
