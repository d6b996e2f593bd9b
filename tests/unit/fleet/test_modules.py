"""The nodeprep.fleet modules: documentation (as ansible-doc renders it, with the collection's
documentation fragments) agrees with argument_spec, and the zipapp builder is reproducible and
gives a runnable nodeprep (built from this checkout, run with a real interpreter)."""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from nodeprep import runner

from .conftest import MODULES, REPO

MODULE_NAMES = sorted(p.stem for p in MODULES.glob("*.py") if not p.name.startswith("_"))


def _load(name: str):  # type: ignore[no-untyped-def]
    return importlib.import_module(f"ansible_collections.nodeprep.fleet.plugins.modules.{name}")


def _code(name: str):  # type: ignore[no-untyped-def]
    """The module_utils file with the module's argument_spec (and main)."""
    utils = name if name == "nodeprep_zipapp" else name.replace("nodeprep_", "nodeprep_op_")
    return importlib.import_module(f"ansible_collections.nodeprep.fleet.plugins.module_utils.{utils}")


@pytest.fixture(scope="session")
def rendered() -> dict[str, dict[str, object]]:
    """Every module's documentation as ansible-doc renders it (fragments merged), by module name."""
    pytest.importorskip("ansible")
    r = runner.run(
        [sys.executable, "-m", "ansible.cli.doc", "--json", "-t", "module",
         *(f"nodeprep.fleet.{n}" for n in MODULE_NAMES)],
        cwd=REPO, timeout=120, inherit_env=True, env={"ANSIBLE_CONFIG": str(REPO / "ansible.cfg")},
    )
    return {k.rsplit(".", 1)[1]: v for k, v in json.loads(r.stdout).items()}


@pytest.mark.parametrize("name", MODULE_NAMES)
def test_documentation_matches_argument_spec(
    collection_on_path: Path, rendered: dict[str, dict[str, object]], name: str
) -> None:
    mod = _load(name)
    doc = rendered[name]["doc"]
    assert isinstance(doc, dict)
    spec = _code(name).argument_spec()
    assert doc["module"] == name and doc["author"] == ["nodeprep maintainers"]
    assert sorted(doc["options"]) == sorted(spec)
    for option, want in spec.items():
        documented = doc["options"][option]
        assert documented.get("type", "str") == want.get("type", "str"), option
        assert documented.get("default") == want.get("default"), option
        assert documented.get("choices") == want.get("choices"), option
        assert bool(documented.get("required")) == bool(want.get("required")), option
        assert documented.get("description"), option
    check = doc["attributes"]["check_mode"]
    assert check["support"] == "full" or (check["support"] == "partial" and check.get("details"))
    # the fragment that says "no diff" wins over the base fragment's diff_mode only when listed first
    fragments = yaml.safe_load(mod.DOCUMENTATION).get("extends_documentation_fragment", [])
    if "nodeprep.fleet.nodeprep.no_diff" in fragments:
        assert doc["attributes"]["diff_mode"]["support"] == "none", name
    yaml.safe_load(mod.EXAMPLES)
    yaml.safe_load(mod.RETURN)


def test_zipapp_is_reproducible_and_runs(collection_on_path: Path, tmp_path: Path) -> None:
    mod = _load("nodeprep_zipapp")
    first, count = mod.build(str(REPO), [], sys.executable)
    second, _ = mod.build(str(REPO), [], sys.executable)
    assert hashlib.sha256(first).digest() == hashlib.sha256(second).digest()
    assert first.startswith(b"#!" + sys.executable.encode() + b"\n")
    app = tmp_path / "nodeprep.pyz"
    app.write_bytes(first)
    with zipfile.ZipFile(app) as zf:
        names = zf.namelist()
        assert names[0] == "__main__.py" and "nodeprep/cli.py" in names and len(names) == count
        assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
        assert {i.date_time for i in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}
    r = runner.run([sys.executable, app, "--help"], timeout=60)
    assert "Usage:" in r.stdout


def test_zipapp_vendors_extra_packages(collection_on_path: Path, tmp_path: Path) -> None:
    vendor = tmp_path / "vendor"
    (vendor / "tinydep").mkdir(parents=True)
    (vendor / "tinydep/__init__.py").write_text("VALUE = 42\n")
    (vendor / "tinydep-1.0.dist-info").mkdir()
    data, _ = _load("nodeprep_zipapp").build(str(REPO), [str(vendor)], "/usr/bin/python3")
    app = tmp_path / "app.pyz"
    app.write_bytes(data)
    r = runner.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.path.insert(0, sys.argv[1]); import tinydep; print(tinydep.VALUE)",
            app,
        ]
    )
    assert r.stdout.strip() == "42"
    assert not [n for n in zipfile.ZipFile(app).namelist() if ".dist-info" in n]
