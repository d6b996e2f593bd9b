"""nodeprep.node sits below nodeprep.join: no module of node/ imports join/, not even inside a
function (activation reaches join only through the hooks the front-ends pass, node/hooks.py)."""

from __future__ import annotations

import ast
from pathlib import Path

NODE = Path(__file__).resolve().parents[3] / "nodeprep" / "node"


def imported(path: Path) -> set[str]:
    """Every module an import statement anywhere in `path` names, relative ones resolved."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "nodeprep.node" if node.level == 1 else "nodeprep" if node.level == 2 else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            names.add(module)
            names.update(f"{module}.{a.name}" for a in node.names)
    return names


def test_node_does_not_import_join() -> None:
    found = {p.name: sorted(n for n in imported(p) if n.startswith("nodeprep.join"))
             for p in NODE.glob("*.py")}
    assert len(found) > 10
    assert {k: v for k, v in found.items() if v} == {}
