#!/usr/bin/env python3
"""Which imports inside functions of nodeprep/ save a start time: for each one, what moving it to the
top of its module would add to the starts paid often (the CLI's --help, the container hook, the light
imports tests/unit/test_import_cost.py holds, each Ansible module's task imports). Goal: none that no
measured start needs (docs/function-imports.md has the method and the last result).

Every start and every import statement is run in a fresh interpreter (this checkout on PYTHONPATH);
module sets are exact, times the least of --runs runs (indicative on a loaded machine).

    python3 bench/function_imports.py [--runs N] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchlib import Goals, run, use_venv  # noqa: E402  (bench/benchlib.py, next to this file)

use_venv()

MODULE_UTILS = REPO / "collections/ansible_collections/nodeprep/fleet/plugins/module_utils"
HOOK = "import nodeprep.containerhooks.spec, nodeprep.containerhooks.gate\n"


def cli(args: list[str]) -> str:
    return ("import contextlib, io\nfrom nodeprep.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    try:\n        main({args!r})\n    except SystemExit:\n        pass\n")


def light() -> dict[str, list[str]]:
    """tests/unit/test_import_cost.py's LIGHT table: module -> modules it must not load."""
    tree = ast.parse((REPO / "tests/unit/test_import_cost.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "LIGHT" for t in node.targets):
            value: dict[str, list[str]] = ast.literal_eval(node.value)
            return value
    raise SystemExit("bench: no LIGHT table in tests/unit/test_import_cost.py")


def ansible_imports() -> dict[str, list[str]]:
    """Each node-side module's library imports (host.import_nodeprep(module, NAME, ...))."""
    out = {}
    for path in sorted(MODULE_UTILS.glob("nodeprep_op_*.py")):
        names = sorted({a.value for n in ast.walk(ast.parse(path.read_text()))
                        if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "import_nodeprep"
                        for a in n.args if isinstance(a, ast.Constant) and isinstance(a.value, str)})
        if names:
            out["Ansible " + path.stem.replace("_op_", "_")] = names
    return out


def starts(rules: dict[str, list[str]]) -> dict[str, str]:
    table = {"nodeprep --help": cli(["--help"]), "nodeprep labels --help": cli(["labels", "--help"]),
             "container hook (spec + gate)": HOOK}
    table.update({f"import {m}": f"import {m}\n" for m in sorted(rules)})
    table.update({k: "".join(f"import {n}\n" for n in v) for k, v in ansible_imports().items()})
    return table


class _Finder(ast.NodeVisitor):
    """Import statements whose nearest enclosing definition is a function (a class body is not one)."""

    def __init__(self, path: Path) -> None:
        self.parts = list(path.relative_to(REPO).with_suffix("").parts)
        self.package = path.name == "__init__.py"
        if self.package:
            self.parts = self.parts[:-1]
        self.file = str(path.relative_to(REPO / "nodeprep"))
        self.stack: list[str] = []
        self.guarded = 0  # inside a try that handles ImportError: an optional module, absent at the call
        self.found: list[dict[str, Any]] = []

    def _scope(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef, name: str) -> None:
        self.stack.append(name)
        self.generic_visit(node)
        self.stack.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:  # noqa: N802 - ast.NodeVisitor's names
        self._scope(node, node.name)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:  # noqa: N802
        self._scope(node, node.name)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:  # noqa: N802
        self._scope(node, "class " + node.name)

    def visit_Try(self, node: ast.Try) -> None:  # noqa: N802
        names = {ast.unparse(h.type) for h in node.handlers if h.type is not None}
        if not names & {"ImportError", "ModuleNotFoundError"}:
            self.generic_visit(node)
            return
        self.guarded += 1
        for stmt in [*node.body, *node.handlers]:
            self.visit(stmt)
        self.guarded -= 1
        for stmt in [*node.orelse, *node.finalbody]:
            self.visit(stmt)

    def _import(self, node: ast.Import | ast.ImportFrom) -> None:
        if not self.stack or self.stack[-1].startswith("class "):
            return
        statement = ast.unparse(node)
        if isinstance(node, ast.ImportFrom) and node.level:
            base = self.parts[:len(self.parts) - node.level + (1 if self.package else 0)]
            module = ".".join([*base, *([node.module] if node.module else [])])
            statement = f"from {module} import " + ", ".join(a.name for a in node.names)
        self.found.append({"module": ".".join(self.parts), "file": self.file, "line": node.lineno,
                           "func": ".".join(s.removeprefix("class ") for s in self.stack),
                           "statement": statement, "guarded": bool(self.guarded)})

    def visit_Import(self, node: ast.Import) -> None:  # noqa: N802
        self._import(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:  # noqa: N802
        self._import(node)


def function_imports() -> list[dict[str, Any]]:
    """Every import inside a function of nodeprep/, relative imports made absolute."""
    found: list[dict[str, Any]] = []
    for path in sorted((REPO / "nodeprep").rglob("*.py")):
        finder = _Finder(path)
        finder.visit(ast.parse(path.read_text()))
        found += finder.found
    return found


def python(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=120, check=False)
    if r.returncode:
        raise SystemExit(f"bench: {code.strip().splitlines()[-1]!r} failed: {r.stderr.strip()[-300:]}")
    return r.stdout.splitlines()[-1]


def loaded(code: str) -> set[str]:
    listing = "import json as _j, sys as _s\nprint(_j.dumps(sorted(_s.modules)))\n"
    return set(json.loads(python(code + listing)))


def least_ms(before: str, statement: str, runs: int) -> float:
    code = f"{before}import time as _t\n_a = _t.perf_counter()\n{statement}\nprint(_t.perf_counter() - _a)\n"
    return min(float(python(code)) for _ in range(runs)) * 1000


def verdict(added: dict[str, list[str]], rules: dict[str, list[str]]) -> tuple[str, list[str]]:
    """stay / marginal / move, and the starts whose LIGHT rule the move would break."""
    held = [s for s, mods in added.items()
            if s.startswith("import ") and set(mods) & set(rules.get(s[7:], []))]
    if not added:
        return "move", held
    heavy = any(len(m) >= 5 or any(not x.startswith("nodeprep") for x in m) for m in added.values())
    hook = any(s.startswith("container hook") for s in added)
    return ("stay" if heavy or held or hook else "marginal"), held


def markdown(rows: list[dict[str, Any]], counts: dict[str, int]) -> str:
    def target(s: str) -> str:
        return s[5:].replace(" import ", ": ") if s.startswith("from ") else s[7:]

    out = [f"{len(rows)} imports inside functions in {len({r['file'] for r in rows})} modules: "
           + ", ".join(f"{n} {k}" for k, n in counts.items()), ""]
    for kind in ("stay", "marginal", "guarded"):
        out += [f"### {kind.capitalize()}", "", "| where (line: function) | what it imports | "
                "what moving it up would add (modules; ms) |", "| --- | --- | --- |"]
        for r in (r for r in rows if r["verdict"] == kind):
            cells = "; ".join(f"{s} +{len(m)} ({r['ms'][s]:.0f} ms)" + (" **test**" if s in r["held"] else "")
                              for s, m in r["added"].items())
            out.append(f"| `{r['file']}` {r['line']}: `{r['func']}` | `{target(r['statement'])}` | {cells} |")
        out.append("")
    out += ["### Can move", "", "| module | imports (line: what) | why no measured start pays for it |",
            "| --- | --- | --- |"]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in (r for r in rows if r["verdict"] == "move"):
        why = (f"loaded by {', '.join(sorted(r['starts']))}, which already hold what it imports"
               if r["starts"] else "no measured start loads the module")
        groups.setdefault((r["file"], why), []).append(r)
    for (file, why), rs in sorted(groups.items()):
        out.append(f"| `{file}` | " + "; ".join(f"{r['line']}: `{target(r['statement'])}`" for r in rs)
                   + f" | {why} |")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="fresh runs per timed import (the least is kept)")
    ap.add_argument("--markdown", type=Path, help="also write the tables of docs/function-imports.md here")
    args = ap.parse_args()
    rules = light()
    table = starts(rules)
    sets = {name: loaded(code) for name, code in table.items()}
    for name, mods in sets.items():
        print(f"start {name}: {len(mods)} modules")
    closure: dict[str, set[str]] = {}
    timed: dict[tuple[str, str], float] = {}
    rows = function_imports()
    for r in rows:
        if r["statement"] not in closure:
            closure[r["statement"]] = loaded(r["statement"] + "\n")
        r["starts"] = [s for s, mods in sets.items() if r["module"] in mods]
        r["added"] = {s: sorted(closure[r["statement"]] - sets[s]) for s in r["starts"]}
        r["added"] = {s: m for s, m in r["added"].items() if m}
        for s in r["added"]:
            if (s, r["statement"]) not in timed:
                timed[s, r["statement"]] = least_ms(table[s], r["statement"], args.runs)
        r["ms"] = {s: timed[s, r["statement"]] for s in r["added"]}
        r["verdict"], r["held"] = verdict(r["added"], rules)
        if r["verdict"] == "move" and r["guarded"]:
            r["verdict"] = "guarded"
        spent = ", ".join(f"{s} +{len(m)} ({r['ms'][s]:.0f} ms)" for s, m in r["added"].items()) or "nothing"
        print(f"{r['verdict']:<8} nodeprep/{r['file']}:{r['line']} {r['func']}: {r['statement']}"
              f"  adds {spent}")
    counts = {k: sum(r["verdict"] == k for r in rows) for k in ("stay", "marginal", "guarded", "move")}
    print(f"{len(rows)} imports inside functions: {counts['stay']} stay, {counts['marginal']} marginal, "
          f"{counts['guarded']} guarded (an absent optional module handled at the call), "
          f"{counts['move']} no measured start needs; median start load "
          f"{statistics.median(len(m) for m in sets.values()):.0f} modules")
    if args.markdown:
        args.markdown.write_text(markdown(rows, counts))
    goals = Goals()
    print(f"imports inside functions no measured start needs: {counts['move']} (goal 0)  "
          f"{goals.at_most('no import inside a function without a reason measured', counts['move'], 0)}")
    return goals.exit_code()


if __name__ == "__main__":
    run(main)
