"""The import floors of nodeprep/: every import of a library module, at module level or inside a
function, names a module of its own floor or of a floor below, and no modules import each other,
directly or round a loop (docs/architecture.md's table lists the floors in this order). So node/
imports nothing of join/: the front-ends pass join.activation.CALLBACKS in (node/callbacks.py)."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

NODEPREP = Path(__file__).resolve().parents[2] / "nodeprep"

# The floors, top to bottom: the one place that says the order. A module belongs to the floor of
# the entry that names it or the package it is in ("__init__" is nodeprep/__init__.py alone).
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("front-ends", ("cli", "commands", "__main__")),
    ("bootstrap", ("bootstrap", "cloudinit")),
    ("upgrade", ("upgrade",)),
    ("build", ("builder",)),
    ("sources", ("sources",)),
    ("targets", ("targets",)),
    ("join", ("join",)),
    ("runtime", ("runtime",)),
    ("health", ("health",)),
    ("node", ("node",)),
    ("containers", ("containerhooks", "cuda")),
    ("labels", ("labels",)),
    ("artifacts", ("artifact", "safetar", "elf", "modinfo", "sonames", "stores", "download", "digests")),
    ("shared", ("profile", "labelrules", "kubeletflags", "vocab", "kubeapi")),
    # stores/ref.py parses oci:// store locations as urls.py parses http(s) ones: the profile's checks
    # refuse a driver.store with them, so both sit below the profile
    ("edges", ("__init__", "runner", "log", "progress", "errors", "paths", "rootpath", "sysfs", "pci",
               "atomicfile", "crash", "yamlinput", "urls", "stores.ref")),
)

# Imports that go up a floor on purpose, each with its reason: (importer, imported).
UPWARD: dict[tuple[str, str], str] = {}


def modules() -> dict[str, Path]:
    """Dotted name -> file of every module of nodeprep/ (a package is its __init__.py)."""
    out = {}
    for path in NODEPREP.rglob("*.py"):
        parts = path.relative_to(NODEPREP.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = modules()
_FLOOR_OF = {entry: i for i, (_, entries) in enumerate(FLOORS) for entry in entries}


def floor(module: str) -> int:
    """Index in FLOORS of `module`'s floor; KeyError for a module no floor names."""
    name = module.removeprefix("nodeprep").removeprefix(".") or "__init__"
    while name not in _FLOOR_OF:
        if "." not in name:
            raise KeyError(module)
        name = name.rpartition(".")[0]
    return _FLOOR_OF[name]


def _known(name: str) -> str:
    """The module an import of `name` loads last: `name`, or the package that holds the attribute."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


@functools.cache
def imports(module: str) -> tuple[tuple[str, int, bool], ...]:
    """(imported module of nodeprep, line, runs) for every import statement of `module`, those
    inside functions included; `runs` is False under `if TYPE_CHECKING:` (annotations only)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def walk(node: ast.AST, runs: bool) -> Iterator[tuple[str, int, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                yield from ((_known(a.name), child.lineno, runs) for a in child.names
                            if a.name.split(".")[0] == "nodeprep")
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[:len(package.split(".")) - child.level + 1]
                    name = ".".join(base + ([child.module] if child.module else []))
                else:
                    name = child.module or ""
                if name.split(".")[0] == "nodeprep":
                    yield from ((_known(f"{name}.{a.name}"), child.lineno, runs) for a in child.names)
            typing_only = isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
            yield from walk(child, runs and not typing_only)

    return tuple(walk(ast.parse(path.read_text(), str(path)), True))


def graph() -> dict[str, set[str]]:
    """Module -> the modules it loads when its imports run (itself left out)."""
    return {m: {t for t, _, runs in imports(m) if runs and t != m} for m in MODULES}


def test_every_module_has_a_floor() -> None:
    assert len(MODULES) > 100
    unplaced = []
    for module in sorted(MODULES):
        try:
            floor(module)
        except KeyError:
            unplaced.append(module)
    assert unplaced == []


def test_imports_go_down() -> None:
    up = sorted({f"{MODULES[module].relative_to(NODEPREP.parent)}:{line}: {module} "
                 f"({FLOORS[floor(module)][0]}) imports {target} ({FLOORS[floor(target)][0]})"
                 for module in MODULES for target, line, _ in imports(module)
                 if floor(target) < floor(module) and (module, target) not in UPWARD})
    assert not up, "\n".join(up)


def test_allowed_upward_imports_exist() -> None:
    """An allowance nobody uses any more is taken out, so it cannot hide a new import."""
    used = {(m, t) for m in MODULES for t, _, _ in imports(m)}
    assert set(UPWARD) <= used


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


@pytest.mark.parametrize(("edges", "want"), [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
])
def test_cycles_finds_loops(edges: dict[str, set[str]], want: list[list[str]]) -> None:
    assert cycles(edges) == want
