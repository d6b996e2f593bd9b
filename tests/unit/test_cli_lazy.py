"""The lazy command line (nodeprep/cli.py): `nodeprep --help` lists every command without importing
their modules, the table names exactly the commands the modules export, and the listing is what
click prints with every command loaded, at any width. Nothing GPU-like is used."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest

from nodeprep import cli
from tests.support.fixtures import REPO

MODULES = {"build", "install", "labels", "join", "profile", "smoke", "bootstrap", "verify", "mig",
           "health", "upgrade"}


def _loaded_after(args: list[str]) -> set[str]:
    code = (f"import json, sys\nfrom nodeprep.cli import main\ntry:\n    main({args!r})\nexcept SystemExit:\n"
            "    pass\nprint(json.dumps(sorted(sys.modules)), file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    return set(json.loads(r.stderr.strip().splitlines()[-1]))


def test_help_imports_no_command_module() -> None:
    loaded = _loaded_after(["--help"])
    assert not {m for m in loaded if m.startswith("nodeprep.commands.")}, sorted(loaded)
    assert "nodeprep.profile" not in loaded


def test_a_command_loads_only_its_module() -> None:
    loaded = {m for m in _loaded_after(["health", "--help"]) if m.startswith("nodeprep.commands.")}
    assert loaded == {"nodeprep.commands.health", "nodeprep.commands.clioptions"}, sorted(loaded)


def _eager() -> click.Group:
    group = click.Group("nodeprep")
    for loader, _ in cli.COMMANDS.values():
        for cmd in loader():
            group.add_command(cmd)
    return group


def test_table_names_every_command_with_its_short_help() -> None:
    eager = _eager()
    assert sorted(eager.commands) == sorted(cli.COMMANDS)
    for name, (_, short) in cli.COMMANDS.items():
        assert eager.commands[name].get_short_help_str(10**6) == short, name
    assert {loader.__name__.lstrip("_") for loader, _ in cli.COMMANDS.values()} == MODULES


@pytest.mark.parametrize("width", [50, 80, 120, 200])
def test_listing_is_the_eager_one(width: int) -> None:
    lazy = cli.NodeprepGroup("nodeprep")
    eager = _eager()
    out = []
    for group in (lazy, eager):
        formatter = click.HelpFormatter(width=width)
        group.format_commands(click.Context(group), formatter)
        out.append(formatter.getvalue())
    assert out[0] == out[1] and "verify-nodes" in out[0]
    assert not lazy.commands.loaded  # type: ignore[attr-defined]  # the listing loaded nothing


def test_unknown_command_is_one_error_line() -> None:
    r = subprocess.run([sys.executable, "-m", "nodeprep.cli", "no-such"], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and r.stderr == "error: No such command 'no-such'.\n"
