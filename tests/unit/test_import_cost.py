"""Ansible modules start a fresh interpreter per task: importing one submodule must not load the
heavy parts of its package (docs/design-decisions.md, "Import cost"), and no library module loads a
sibling by a name in a string."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# module imported alone -> modules it must not load
LIGHT = {
    "nodeprep.runtime.cdi": ["nodeprep.join.joinplan", "nodeprep.runtime.plan", "nodeprep.join.kube",
                             "nodeprep.labels.core"],
    "nodeprep.join.activation": ["nodeprep.join.joinplan", "nodeprep.runtime.cdi", "nodeprep.node.installer",
                                 "nodeprep.node.switch"],
    "nodeprep.labels.gpu": ["nodeprep.labels.cloud", "nodeprep.labels.nodepatch", "nodeprep.labels.core"],
    "nodeprep.atomicfile": ["nodeprep.node.installer", "nodeprep.node.switch", "nodeprep.node.state",
                            "nodeprep.artifact"],
    # hashing a file needs none of the artifact format
    "nodeprep.digests": ["nodeprep.artifact", "tarfile", "zstandard"],
    "nodeprep.download": ["nodeprep.artifact", "tarfile", "zstandard"],
    # the Kubernetes API client sits below labels and join; the GPU verdict needs no label patching
    "nodeprep.kubeapi": ["nodeprep.labels.core", "nodeprep.labels.nodepatch", "nodeprep.join.joinplan"],
    "nodeprep.join.verification": ["nodeprep.labels.nodepatch"],
    # the command line loads a command's module when that command runs (nodeprep/cli.py)
    "nodeprep.cli": ["nodeprep.commands.build", "nodeprep.commands.install", "nodeprep.commands.health",
                     "nodeprep.commands.usage", "nodeprep.profile", "yaml"],
}

# the collection's probes: they find out whether nodeprep is importable on the host at all
PROBES = {"nodeprep_host.py", "nodeprep_op_info.py"}


def _loaded(module: str) -> set[str]:
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
    return set(json.loads(out))


@pytest.mark.parametrize("module", sorted(LIGHT))
def test_submodule_import_stays_light(module: str) -> None:
    loaded = _loaded(module)
    assert module in loaded
    assert not loaded & set(LIGHT[module]), sorted(loaded & set(LIGHT[module]))


def _string_imports(path: Path) -> list[int]:
    """Lines that call importlib.import_module / __import__."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in ("import_module", "__import__"):
                lines.append(node.lineno)
    return lines


def test_no_import_by_string() -> None:
    roots = [REPO / "nodeprep", REPO / "bench", REPO / "scripts", REPO / "acceptance", REPO / "collections"]
    found = {}
    for path in sorted(p for r in roots for p in r.rglob("*.py")):
        lines = _string_imports(path)
        if not lines:
            continue
        if path.name in PROBES:
            text = path.read_text().splitlines()
            # each probe says why, on the line above or on the line itself
            unexplained = [n for n in lines if "probe" not in text[n - 1] + text[n - 2]]
            if unexplained:
                found[str(path.relative_to(REPO))] = unexplained
        else:
            found[str(path.relative_to(REPO))] = lines
    assert not found, found
