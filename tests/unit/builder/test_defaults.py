"""One default store (./artifacts) and one default cache for every command (nodeprep/paths.py), and
the next steps build-driver prints after a build."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from nodeprep import artifact, runner
from nodeprep.builder.driver import BuildResult
from nodeprep.cli import main
from nodeprep.commands.build import next_steps

from .kmodstore import publish_kmod

REPO = Path(__file__).resolve().parents[3]


def test_artifacts_list_and_verify_default_to_the_build_store(tmp_path, monkeypatch):
    """In the directory where `build-driver` wrote ./artifacts, no STORE argument is needed."""
    kmod = publish_kmod(tmp_path / "artifacts", tmp_path)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["artifacts", "list", "--json"])
    assert res.exit_code == 0, res.output
    assert [e["name"] for e in json.loads(res.stdout)] == [kmod.name]
    res = CliRunner().invoke(main, ["artifacts", "verify"])
    assert res.exit_code == 0 and "artifacts: 1 artifacts verified" in res.stderr
    monkeypatch.chdir(tmp_path / "artifacts")  # no ./artifacts here: the usual clear error
    res = CliRunner().invoke(main, ["artifacts", "verify"])
    assert res.exit_code == 2 and res.stderr.startswith("error: artifacts: store directory does not exist")


HELP = """
import sys
from click.testing import CliRunner
from nodeprep.cli import main
for cmd in sys.argv[1:]:
    print("=== " + cmd)
    print(CliRunner().invoke(main, [*cmd.split(), "--help"], terminal_width=400).output)
"""


def _helps(env: dict[str, str], *cmds: str) -> dict[str, str]:
    """`--help` of each command, in one fresh interpreter with `env` (defaults are read at import)."""
    res = runner.run([sys.executable, "-c", HELP, *cmds], cwd=REPO, env={"PYTHONPATH": str(REPO), **env})
    parts = res.stdout.split("=== ")[1:]
    return {p.split("\n", 1)[0]: " ".join(p.split("\n", 1)[1].split()) for p in parts}


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"HOME": "/home/builder"}, "/home/builder/.cache/nodeprep"),
        ({"HOME": "/home/builder", "XDG_CACHE_HOME": "/srv/xdg"}, "/srv/xdg/nodeprep"),
        ({"HOME": "/home/builder", "NODEPREP_CACHE": "/var/cache/np"}, "/var/cache/np"),
    ],
)
def test_every_command_shows_the_same_default_cache(env, expected):
    """build-driver, build-matrix and smoke-test share one cache: the smoke test after the quick
    start finds the kernel build-driver downloaded."""
    helps = _helps(env, "build-driver", "build-matrix", "smoke-test", "artifacts list", "artifacts verify")
    for cmd in ("build-driver", "build-matrix", "smoke-test"):
        assert "--cache DIRECTORY" in helps[cmd], cmd
        assert f"[default: {expected}]" in helps[cmd], (cmd, helps[cmd])
    assert "default: ./artifacts" in helps["artifacts list"]
    assert "default: ./artifacts" in helps["artifacts verify"]
    assert "[default: artifacts]" in helps["build-driver"]


def test_next_steps_carry_this_builds_arguments(tmp_path):
    kmod = publish_kmod(tmp_path / "artifacts", tmp_path)
    manifest = artifact.read_manifest(kmod)
    result = BuildResult(kmod, manifest, cached=False, compiled=True, input_digest="f" * 64)
    lines = next_steps(result, store=tmp_path / "artifacts", cache=tmp_path / "cache")
    assert lines[0] == "next steps:"
    text = "\n".join(lines)
    smoke = shlex.split(text.split("smoke test (qemu boot of 6.1.0-56-amd64):  ", 1)[1].splitlines()[0])
    assert smoke == ["nodeprep", "smoke-test", str(kmod), "--cache", str(tmp_path / "cache")]
    install = shlex.split(text.split("install on a node (as root):  ", 1)[1].splitlines()[0])
    assert install == [
        "nodeprep", "install", "--store", str((tmp_path / "artifacts").resolve()), "--driver", "535.309.01",
        "--flavour", "proprietary", "--kernel", "6.1.0-56-amd64", "--activate",
    ]
    assert "--root /tmp/nodeprep-root --no-load" in text
    assert "driver.version 535.309.01, driver.flavour proprietary, driver.kernel 6.1.0-56-amd64" in text
    assert "nodeprep cloud-init --profile node.yaml --out user-data" in text
    # every printed command is one the CLI accepts (parsed by click, not run)
    for argv in (smoke, install):
        cmd = main.get_command(main.make_context("nodeprep", ["--help"], resilient_parsing=True), argv[1])
        assert cmd is not None
        cmd.make_context(argv[1], argv[2:])
