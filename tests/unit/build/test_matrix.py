"""Build matrix YAML -> cells, and `nodeprep build-matrix FILE` output (parsed back)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from nodeprep.build import matrix
from nodeprep.cli import main
from nodeprep.errors import ProfileError

YAML = """
os: debian-12
drivers: [535.309.01, "525", latest]
kernels: [6.1.0-56-amd64, 6.1.0-50-amd64]
flavours: [proprietary, open]
exclude:
  - {driver: "525", flavour: open}
  - {driver: latest, kernel: 6.1.0-50-amd64}
"""


def test_expand_with_excludes():
    cells = matrix.parse(YAML)
    assert len(cells) == 3 * 2 * 2 - 2 - 2
    assert matrix.Cell("debian-12", "525", "open", "6.1.0-56-amd64") not in cells
    assert matrix.Cell("debian-12", None, "proprietary", "6.1.0-50-amd64") not in cells
    assert matrix.Cell("debian-12", None, "open", "6.1.0-56-amd64") in cells
    assert cells[0].args() == [
        "--os",
        "debian-12",
        "--flavour",
        "proprietary",
        "--driver",
        "535.309.01",
        "--kernel",
        "6.1.0-56-amd64",
    ]


def test_defaults():
    cells = matrix.parse("drivers: [535]\n")
    assert cells == [matrix.Cell("debian-12", "535", "proprietary", None)]


def test_every_problem_is_reported_with_its_field():
    with pytest.raises(ProfileError) as e:
        matrix.parse(
            "os: debian-14\ndrivers: [abc, 535]\nflavours: [closed]\nkernel: x\nexclude: [{arch: arm64}]\n",
            source="m.yaml",
        )
    assert e.value.problems == [
        "kernel: unknown key (known: drivers, exclude, flavours, kernels, os)",
        "os: unknown OS 'debian-14' (known: debian-12, debian-13, rhel-9, ubuntu-22.04, ubuntu-24.04)",
        "drivers[0]: 'abc' is not a driver version or branch (or 'latest')",
        "flavours[0]: 'closed' is not one of proprietary, open",
        "exclude[0].arch: unknown key (driver, kernel, flavour)",
    ]


def test_cli_prints_matrix_json(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text(YAML)
    res = CliRunner().invoke(main, ["build-matrix", str(f)])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert len(data["include"]) == 8
    assert data["include"][0]["args"][:2] == ["--os", "debian-12"]


def test_cli_bad_matrix_exits_2_with_one_line(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text("drivers: {a: 1}\n")
    res = CliRunner().invoke(main, ["build-matrix", str(f)])
    assert res.exit_code == 2
    assert res.stderr.strip() == f"error: {f}: drivers: must be a non-empty list"
    res = CliRunner().invoke(main, ["build-matrix", str(tmp_path / "missing.yaml")])
    assert res.exit_code == 2 and "missing.yaml" in res.stderr
