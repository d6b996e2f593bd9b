"""The CDI hook program nodeprep writes on the node (/usr/libexec/nodeprep/cdi-hook): self-contained
(no path of the machine or checkout that wrote it), complete (every module the hook imports is in
it), and only written where the node has a /usr/bin/python3 that can run it (#28)."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from nodeprep.cli import main
from nodeprep.runtime import hookprogram
from nodeprep.runtime.files import apply_changes

REPO = Path(__file__).resolve().parents[3]


def _imports(name: str) -> set[str]:
    """Absolute names of the nodeprep modules `name`'s source imports (relative imports resolved)."""
    source = sys.modules[name].__spec__.loader.get_source(name)  # type: ignore[union-attr]
    package = name if name in hookprogram.PACKAGES else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source, feature_version=hookprogram.MIN_PYTHON)):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            found |= ({f"{base}.{node.module}"} if node.module
                      else {base} | {f"{base}.{a.name}" for a in node.names})  # from .. import runner
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nodeprep"):
            found.add(str(node.module))
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("nodeprep")}
    return found


def test_the_program_holds_every_module_the_hook_imports() -> None:
    hookprogram.render_modules()  # imports what the hook imports lazily
    for name in hookprogram.MODULES:
        missing = {m for m in _imports(name) if m not in hookprogram.MODULES}
        assert not missing, (name, missing)


def test_the_program_names_nothing_of_this_machine(tmp_path: Path) -> None:
    text = hookprogram.render_program().decode()
    assert text.startswith("#!/usr/bin/python3 -IS\n")
    modules = hookprogram.render_modules()
    assert modules.startswith(hookprogram.HEADER.encode())  # uninstall knows it as nodeprep's
    data = hookprogram.read_modules(modules)
    assert sorted(data["sources"]) == sorted(data["code"]) == sorted(hookprogram.MODULES)
    for plain in (text, modules.decode(errors="replace"), *data["sources"].values()):
        assert str(REPO) not in plain and sys.executable not in plain and "sys.path" not in plain
    changes = hookprogram.hook_program(tmp_path)
    assert [c.target for c in changes] == [hookprogram.MODULES_PATH, hookprogram.HOOK_PATH]  # modules first
    apply_changes(changes)
    assert (tmp_path / "usr/libexec/nodeprep/cdi-hook").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "usr/libexec/nodeprep/cdi-hook.modules").stat().st_mode & 0o777 == 0o644
    assert not any(c.changed for c in hookprogram.hook_program(tmp_path))  # written again: kept as they are
    # run from elsewhere, nothing inherited, no nodeprep importable: it still answers
    r = subprocess.run([str(changes[-1].path), "--driver"], capture_output=True, text=True, cwd="/", env={},
                       timeout=60)
    assert r.returncode == 1 and r.stderr.strip() == "nodeprep hook: --driver VERSION is required"


def test_a_start_is_not_slowed_by_parsing_the_modules(tmp_path: Path) -> None:
    """The program a start parses is small; the modules are marshal data read as bytes (a script of
    ~75 KB of string literals cost ~1.4 ms of CPU per start to parse)."""
    assert len(hookprogram.render_program()) < 4096


def _python(root: Path, name: str) -> None:
    (root / "usr/bin").mkdir(parents=True, exist_ok=True)
    shutil.copy("/bin/true", root / "usr/bin" / name)
    (root / "usr/bin/python3").unlink(missing_ok=True)
    (root / "usr/bin/python3").symlink_to(name)


def test_python_version_of_a_root(tmp_path: Path) -> None:
    assert hookprogram.python_version(tmp_path) is None
    _python(tmp_path, "python3.11")
    assert hookprogram.python_version(tmp_path) == (3, 11) and hookprogram.python_problem(tmp_path) is None
    _python(tmp_path, "python3.8")
    assert "is Python 3.8; nodeprep's CDI hook" in str(hookprogram.python_problem(tmp_path))
    (tmp_path / "usr/bin/python3").unlink()
    shutil.copy("/bin/true", tmp_path / "usr/bin/python3")  # not a link: the one stdlib tells
    (tmp_path / "usr/lib/python3.12").mkdir(parents=True)
    (tmp_path / "usr/lib/python3.12/os.py").write_text("")
    assert hookprogram.python_version(tmp_path) == (3, 12)


def _runtime(root: Path, tmp_path: Path, smi_xml: Path) -> tuple[int, str, str]:
    profile = tmp_path / "node.yaml"
    profile.write_text(yaml.safe_dump({"driver": {"version": "535.309.01"}}))
    r = CliRunner().invoke(main, ["runtime", "--profile", str(profile), "--root", str(root),
                                  "--nvidia-smi-xml", str(smi_xml), "--json"])
    return r.exit_code, r.stdout, r.stderr


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_runtime_refuses_a_root_without_python3(tmp_path: Path) -> None:
    from tests.unit.join.conftest import FIXTURES, install_driver

    root = tmp_path / "root"
    root.mkdir()
    install_driver(root, tmp_path / "work")
    (root / "usr/bin/python3").unlink()
    smi = FIXTURES / "dual-rtx-a5000_590.44.01.xml"
    before = _tree(root)
    code, _, err = _runtime(root, tmp_path, smi)
    assert code == 1 and err.splitlines()[0].startswith(f"error: /usr/bin/python3 under {root}: missing")
    assert _tree(root) == before  # nothing written (the node's state: exit 1, as without a driver)
    r = CliRunner().invoke(main, ["runtime", "--check", "--profile", str(tmp_path / "node.yaml"), "--root",
                                  str(root), "--nvidia-smi-xml", str(smi)])
    assert "CDI spec: /usr/bin/python3 under" in r.stdout + r.stderr  # a check reports it as a finding
    assert _tree(root) == before
    _python(root, "python3.11")
    code, out, err = _runtime(root, tmp_path, smi)
    assert code == 0, err
    spec = yaml.safe_load((root / "etc/cdi/nvidia.yaml").read_text())
    assert spec["containerEdits"]["hooks"][0]["path"] == hookprogram.HOOK_PATH
    modules = (root / hookprogram.MODULES_PATH.lstrip("/")).read_bytes()
    assert hookprogram.render_modules(modules) == modules  # the same modules: kept as they are
    assert (root / hookprogram.HOOK_PATH.lstrip("/")).read_bytes() == hookprogram.render_program()
    assert {hookprogram.HOOK_PATH, hookprogram.MODULES_PATH} <= set(json.loads(out)["written"])


def test_another_interpreter_compiles_the_sources(tmp_path: Path) -> None:
    """The bytecode in the modules file is for the writer's magic number; another Python (a node whose
    python3 differs) runs the sources instead."""
    import marshal

    changes = hookprogram.hook_program(tmp_path / "node")
    apply_changes(changes)
    modules, program = (c.path for c in changes)
    raw = modules.read_bytes()
    data = hookprogram.read_modules(raw)
    data["magic"] = b"other"
    data["code"] = {name: b"not bytecode" for name in data["code"]}  # would fail if it were used
    modules.write_bytes(raw[: raw.index(b"\n\n") + 2] + marshal.dumps(data, 4))
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({"process": {"env": ["NVIDIA_REQUIRE_CUDA=cuda>=12.4"]}}))
    r = subprocess.run([str(program), "--driver", "535.309.01"], input=json.dumps({"bundle": str(bundle)}),
                       capture_output=True, text=True, env={}, timeout=60)
    assert r.returncode == 1 and "supports up to CUDA 12.2" in r.stderr, r.stderr


@pytest.mark.parametrize("damage", ["missing", "truncated", "no header"])
def test_a_program_without_its_modules_refuses_in_one_line(tmp_path: Path, damage: str) -> None:
    """A hook that cannot load its modules cannot decide: it refuses the start (exit 1) with one line
    naming the file and what writes it, never a traceback."""
    changes = hookprogram.hook_program(tmp_path)
    apply_changes(changes)
    modules, program = (c.path for c in changes)
    raw = modules.read_bytes()
    if damage == "missing":
        modules.unlink()
    elif damage == "truncated":
        modules.write_bytes(raw[: len(raw) // 2])
    else:
        modules.write_bytes(raw.replace(b"\n\n", b"\n", 1)[:64])
    r = subprocess.run([str(program), "--driver", "535.309.01"], input="{}", capture_output=True, text=True,
                       env={}, timeout=60)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"nodeprep hook: cannot load {program}.modules (")
    assert r.stderr.strip().endswith("`nodeprep runtime` writes it")
