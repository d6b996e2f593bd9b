"""docs/architecture.md is true of the tree: every module of nodeprep/ is named in its table, and a
package `__init__` holds nothing but its docstring unless the doc lists it (and why); and a module's
file name says one concern: no two modules of nodeprep/ share one (docs/glossary.md, "File names")."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NODEPREP = REPO / "nodeprep"
DOC = REPO / "docs/architecture.md"


def _rows() -> list[str]:
    return [line for line in DOC.read_text().splitlines() if line.startswith("| ") and "---" not in line]


def _named(module: Path, rows: list[str]) -> bool:
    """`pkg/name.py` is named by its path, or by `name`/`name.py` in a row that names `pkg/`."""
    rel = module.relative_to(NODEPREP).as_posix()
    package, _, name = rel.rpartition("/")
    stem = name.removesuffix(".py")
    for row in rows:
        tokens = set(re.findall(r"`([^`]+)`", row))
        words = {w for t in tokens for w in re.split(r"[\s,+()]+", t) if w}
        if rel in words:
            return True
        if package and any(w.startswith(f"{package}/") for w in words) and ({stem, name} & words):
            return True
        if not package and name in words:
            return True
    return False


def modules() -> list[Path]:
    return sorted(p for p in NODEPREP.rglob("*.py") if p.name != "__init__.py")


def test_every_module_is_named_in_the_architecture_table() -> None:
    rows = _rows()
    unnamed = [p.relative_to(NODEPREP).as_posix() for p in modules() if not _named(p, rows)]
    assert unnamed == [], f"name these in docs/architecture.md's table: {unnamed}"


def test_no_two_modules_share_a_file_name() -> None:
    by_name: dict[str, list[str]] = {}
    for p in modules():
        if p.name != "__main__.py":
            by_name.setdefault(p.name, []).append(p.relative_to(NODEPREP).as_posix())
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert shared == {}, f"rename one of each (docs/glossary.md, 'File names'): {shared}"


def _holds_code(init: Path) -> bool:
    """Anything beyond a docstring and `from __future__ import annotations`."""
    body = ast.parse(init.read_text()).body
    for node in body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        return True
    return False


def _listed_inits() -> set[str]:
    text = DOC.read_text()
    section = text.split("Package `__init__`s that hold code:", 1)
    assert len(section) == 2, "docs/architecture.md lists the package __init__s that hold code"
    block = section[1].split("\n- ", 1)[0]  # up to the next rule
    return set(re.findall(r"`([\w/]+/__init__\.py)`", block))


def test_no_package_init_holds_code_unless_listed() -> None:
    holding = {p.relative_to(NODEPREP.parent).as_posix() for p in NODEPREP.rglob("__init__.py")
               if _holds_code(p)}
    listed = _listed_inits()
    assert holding - listed == set(), f"list these in docs/architecture.md or empty them: {holding - listed}"
    assert listed - holding == set(), f"listed in docs/architecture.md but hold nothing: {listed - holding}"


def test_the_nvidia_pci_vendor_id_is_spelled_once() -> None:
    """0x10de (as a number, "10de" or "0x10de") only in nodeprep/pci.py, whose enumeration every
    reader of the PCI bus uses."""
    found = []
    for path in sorted(NODEPREP.rglob("*.py")):
        if path == NODEPREP / "pci.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and (node.value == 0x10DE or (
                    isinstance(node.value, str) and node.value.lower() in ("10de", "0x10de"))):
                found.append(f"{path.relative_to(NODEPREP)}:{node.lineno}")
    assert found == [], f"use nodeprep.pci.NVIDIA_VENDOR / NVIDIA_VENDOR_ID: {found}"
