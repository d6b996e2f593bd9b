"""One CliRunner for the in-process CLI tests."""

from __future__ import annotations

from click.testing import CliRunner, Result


def separate_stderr() -> CliRunner:
    """A CliRunner whose results keep stderr apart from stdout (click < 8.2 needs mix_stderr=False;
    from 8.2 on that is the only behaviour and the argument is gone)."""
    try:
        return CliRunner(mix_stderr=False)  # type: ignore[call-arg]  # click < 8.2
    except TypeError:
        return CliRunner()


def invoke(*args: str) -> Result:
    """The real CLI in-process, stdout and stderr together."""
    from nodeprep.cli import main

    return CliRunner().invoke(main, list(args))


def error_line(result: Result) -> str:
    """The one `error:` line of a refused command (and no traceback, no escaped exception)."""
    lines = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return lines[0]
