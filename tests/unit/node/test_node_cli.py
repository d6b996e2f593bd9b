"""CLI errors of the node commands: one line, exit 2, nothing written (click's CliRunner)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from nodeprep.artifact import render_index
from nodeprep.cli import main
from tests.support.clirunner import invoke


@pytest.fixture
def store(tmp_path: Path) -> Path:
    s = tmp_path / "store"
    s.mkdir()
    (s / "index.json").write_bytes(render_index([]))
    return s


def one_error_line(result) -> str:  # type: ignore[no-untyped-def]
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["install", "--driver", "535.x", "--kernel", "6.1.0-28-amd64"],
            "--driver: '535.x' is not a full driver version (expected e.g. 550.90.07)",
        ),
        (["install", "--driver", "535.309.01"], "--kernel: required with --root"),
        (
            ["install", "--driver", "535.309.01", "--kernel", "../x"],
            "--kernel: '../x' is not a kernel release",
        ),
        (
            ["install", "--driver", "535.309.01", "--kernel", "6.1.0-28-amd64"],
            "no user-space artifact for 535.309.01",
        ),
    ],
)
def test_install_bad_input(args: list[str], needle: str, store: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    result = invoke(*args, "--store", str(store), "--root", str(root))
    assert result.exit_code == 2
    assert needle in one_error_line(result)
    assert list(root.iterdir()) == []


@pytest.mark.parametrize(
    "store, needle",
    [("nope", "is not a directory"), (".", "index.json not found")],
    ids=["missing", "no-index"],
)
def test_install_from_a_store_that_is_not_one(tmp_path: Path, store: str, needle: str) -> None:
    """A store directory that does not exist, and one without index.json (tmp_path itself)."""
    result = invoke(
        "install",
        "--store",
        str(tmp_path / store),
        "--driver",
        "535.309.01",
        "--kernel",
        "6.1.0-28-amd64",
        "--root",
        str(tmp_path),
    )
    assert result.exit_code == 2 and needle in one_error_line(result)


def test_activate_not_installed(tmp_path: Path) -> None:
    result = invoke("activate", "535.309.01", "--root", str(tmp_path))
    assert result.exit_code == 2
    assert one_error_line(result) == "error: 535.309.01: not installed (installed: none)"


def test_bad_modules_list(tmp_path: Path) -> None:
    result = invoke("activate", "535.309.01", "--modules", "nvidia,nouveau", "--root", str(tmp_path))
    assert result.exit_code == 2 and "--modules" in one_error_line(result)


def test_rollback_without_previous(tmp_path: Path) -> None:
    result = invoke("rollback", "--root", str(tmp_path))
    assert result.exit_code == 1 and "nothing to roll back to" in result.output


def test_doctor_bad_cuda(tmp_path: Path) -> None:
    result = invoke("doctor", "--require-cuda", "12.7", "--root", str(tmp_path))
    assert result.exit_code == 2 and "CUDA 12.7 is not in nodeprep's table" in one_error_line(result)


def test_doctor_json_on_empty_root(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["doctor", "--json", "--root", str(tmp_path)])
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["ok"] is False and data["checks"][0]["name"] == "state"


def test_list_empty_and_remove_unknown(tmp_path: Path) -> None:
    assert invoke("list", "--root", str(tmp_path)).output.strip() == "no NVIDIA driver installed by nodeprep"
    result = invoke("remove", "535.309.01", "--root", str(tmp_path), "--json")
    assert result.exit_code == 0 and json.loads(result.output)["changed"] is False


@pytest.mark.parametrize(
    "cmd", ["install", "activate", "rollback", "list", "remove", "doctor", "load-modules"]
)
def test_help(cmd: str) -> None:
    result = invoke(cmd, "--help")
    assert result.exit_code == 0 and "Usage:" in result.output
