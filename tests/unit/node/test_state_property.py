"""A hostile state.json under --root (issue #25): every field is checked by type before anything
uses it, so `list`, `doctor` and `activate` either work or refuse with one `error:` line naming the
file and the field, exit 2 - never a traceback - and the root is left as it was.

Hypothesis generates documents from the real state.json of a root with two installed versions:
each field (and the whole document) replaced by arbitrary JSON, wrong types, paths out of the root,
times that are not numbers. The real CLI runs in process on that root.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodeprep.cli import main
from nodeprep.node.state import state_problem
from tests.support.standin import KERNEL, standin_store, tree

V1, V2 = "535.309.01", "535.216.03"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A root with V2 installed and V1 active, and its real state document."""
    work = tmp_path_factory.mktemp("state-property")
    root = work / "root"
    root.mkdir()
    for version, extra in ((V2, []), (V1, ["--activate"])):
        store = standin_store(work / f"work-{version}", work / f"store-{version}", version)
        r = CliRunner().invoke(main, ["install", "--store", str(store), "--driver", version, "--kernel",
                                      KERNEL, "--root", str(root), *extra])
        assert r.exit_code == 0, r.output
    data = json.loads((root / "var/lib/nodeprep/state.json").read_text())
    assert state_problem(data) is None, "what nodeprep writes passes its own check"
    return root, data


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
    | st.sampled_from(["x", "/etc/passwd", "../../etc", "/usr/../etc/passwd", "/usr/bin/\0x", V1, V2,
                      KERNEL]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)

# where a generated value goes in the real document; () = the whole document
PATHS = [(), ("format",), ("active",), ("previous",), ("kernel_hook",), ("kernel_hook", "store"),
         ("kernel_hook", "insecure_http"), ("entry_points",), ("entry_points", 0), ("installed",),
         ("installed", V1), ("installed", V1, "installed_at"), ("installed", V1, "kernels"),
         ("installed", V1, "kernels", 0), ("installed", V1, "firmware_link"),
         ("installed", V1, "kmod_digests"), ("installed", V1, "input_digest"), ("installed", V2, "version"),
         ("installed", "x")]


def _replace(data: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    data = json.loads(json.dumps(data))
    node = data
    for key in path[:-1]:
        if isinstance(node, dict):
            node = node.setdefault(key, {})
        elif isinstance(node, list) and node:
            node = node[0]
    if isinstance(node, dict):
        node[path[-1]] = value
    elif isinstance(node, list):
        node[:1] = [value]
    return data


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(path=st.sampled_from(PATHS), value=JSON)
def test_hostile_state_documents(node: tuple[Path, dict[str, Any]], path: tuple[Any, ...],
                                 value: Any) -> None:
    root, real = node
    doc = _replace(real, path, value)
    state_file = root / "var/lib/nodeprep/state.json"
    state_file.write_text(json.dumps(doc))
    problem = state_problem(doc)
    before = tree(root)
    for args in (["list", "--json"], ["doctor", "--check", "state", "--json"], ["activate", V2, "--check"]):
        r = CliRunner().invoke(main, [*args, "--root", str(root)])
        where = f"{args} {doc!r}: {r.output!r} {r.exception!r}"
        assert r.exception is None or isinstance(r.exception, SystemExit), where
        assert "Traceback" not in r.output, where
        if problem is None:
            assert r.exit_code == 0, where
            continue
        errors = [line for line in r.output.splitlines() if line.startswith("error: ")]
        assert r.exit_code == 2 and len(errors) == 1, where
        assert f"{state_file}: " in errors[0] and problem.split(":")[0] in errors[0], where
        assert tree(root) == before, where


@pytest.mark.parametrize(("path", "value", "field"), [
    (("installed", V1, "installed_at"), "x", f"installed.'{V1}'.installed_at"),
    (("installed", V1, "kernels"), [7], f"installed.'{V1}'.kernels"),
    (("installed", V1, "firmware_link"), "../../etc", f"installed.'{V1}'.firmware_link"),
    (("entry_points",), ["/etc/passwd"], "entry_points[0]"),
    (("kernel_hook",), {"store": 5}, "kernel_hook.store"),
    (("previous",), ["x"], "previous"),
    ((), [], "expected a JSON object"),
])
def test_a_hostile_field_is_named(node: tuple[Path, dict[str, Any]], path: tuple[Any, ...], value: Any,
                                  field: str) -> None:
    """The cases the issue names, through `list` (it tracebacked on `installed_at: "x"`)."""
    root, real = node
    state_file = root / "var/lib/nodeprep/state.json"
    state_file.write_text(json.dumps(_replace(real, path, value)))
    r = CliRunner().invoke(main, ["list", "--root", str(root)])
    assert r.exit_code == 2, r.output
    (line,) = [x for x in r.output.splitlines() if x.startswith("error: ")]
    assert line.startswith(f"error: {state_file}: {field}"), r.output
