"""An artifact's manifest comes from the store: every field of the wrong type or value is refused
with one line naming the artifact and the field, never a traceback (issue 25).

The artifacts are real `.tar.zst` files whose manifest.json bytes are written as given
(tests/support/rawartifact.py); the index lists them as a publisher would. `install` exits 2 with one
`error:` line and installs nothing; so does `artifacts verify` (a refused input, not one of the
checksum problems it lists with exit 1).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from nodeprep import artifact
from nodeprep.cli import main
from nodeprep.errors import ArtifactError
from tests.support import rawartifact as ra

V, K = "535.309.01", "6.1.0-28-amd64"
LIB = "lib64/libnvidia-ml.so.1"
LINK = "lib64/libnvidia-ml.so"
US_MEMBERS = [ra.file(LIB, b"\x7fELF stand-in\n"), ra.link(LINK, "libnvidia-ml.so.1")]


def _set(*path: str, value: Any) -> Callable[[dict[str, Any]], Any]:
    def change(data: dict[str, Any]) -> None:
        node = data
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return change


def _drop(key: str) -> Callable[[dict[str, Any]], Any]:
    return lambda data: data.pop(key)


# name -> (change to a valid userspace manifest, what the error line names)
CASES: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "size-string": (_set("files", LIB, "size", value="31"), f"files.'{LIB}'.size: expected int, got '31'"),
    "mode-string": (_set("files", LIB, "mode", value="755"), f"files.'{LIB}'.mode: expected int, got '755'"),
    "link-target-int": (_set("files", LINK, "target", value=5),
                        f"files.'{LINK}'.target: expected str or null"),
    "files-list": (_set("files", value=[]), "files: expected dict, got []"),
    "files-entry-list": (_set("files", LIB, value=[1]), f"files.'{LIB}': expected a mapping"),
    "size-bool": (_set("files", LIB, "size", value=True), f"files.'{LIB}'.size: expected int, got True"),
    "size-negative": (_set("files", LIB, "size", value=-1), "size -1 or mode"),
    "sha256-int": (_set("files", LIB, "sha256", value=5), f"files.'{LIB}'.sha256: expected str, got 5"),
    "sha256-short": (_set("files", LIB, "sha256", value="ab"), "is not 64 lower-case hex digits"),
    "entry-unknown-field": (_set("files", LIB, "owner", value="root"), "unknown field 'owner'"),
    "kind-int": (_set("kind", value=5), "kind: expected str, got 5"),
    "driver-version-newline": (_set("driver_version", value=V + "\n"), "driver_version: '535.309.01\\n'"),
    "driver-version-path": (_set("driver_version", value="../../etc"), "driver_version: '../../etc'"),
    "arch-missing": (_drop("arch"), "arch: required"),
    "inputs-value-int": (_set("inputs", value={"a.deb": 5}), "inputs.'a.deb': expected str, got 5"),
    "extra-list": (_set("extra", value=[]), "extra: expected dict, got []"),
    "format-string": (_set("format", value="1"), "manifest format '1' is not supported"),
    "top-level-list": (lambda data: data.clear() or data.update({"_list": True}), "unknown field '_list'"),
    "unknown-field": (_set("owner", value="x"), "unknown field 'owner'"),
}


def _store(tmp_path: Path, change: Callable[[dict[str, Any]], Any]) -> Path:
    """A store with a valid kmod and a user space whose manifest bytes carry `change`."""
    store = tmp_path / "store"
    store.mkdir()
    km = [ra.file(f"modules/{K}/nvidia.ko", b"\x7fELF stand-in\n")]
    kman = ra.manifest_for(km, kind="kmod", version=V, kernel=K)
    uman = ra.manifest_for(US_MEMBERS, kind="userspace", version=V)
    data = json.loads(uman.to_json())
    change(data)
    ra.write(store / kman.name, km, kman)
    ra.write(store / uman.name, US_MEMBERS, uman, raw_manifest=json.dumps(data).encode())
    return ra.store_with(store, [(store / kman.name, kman), (store / uman.name, uman)])


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize("case", sorted(CASES))
def test_install_refuses_a_manifest_field_of_the_wrong_type(tmp_path: Path, case: str) -> None:
    change, expect = CASES[case]
    store = _store(tmp_path, change)
    root = tmp_path / "root"
    root.mkdir()
    result = _invoke("install", "--store", str(store), "--driver", V, "--kernel", K, "--root", str(root))
    where = f"{case}: {result.output!r} {result.exception!r}"
    assert result.exit_code == 2, where
    assert "Traceback" not in result.output, where
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, where
    assert f"nvidia-userspace-{V}-amd64.tar.zst:manifest.json" in errors[0] and expect in errors[0], where
    opt = root / "opt/nvidia"
    assert not opt.exists() or [p.name for p in opt.iterdir()] == [], where


@pytest.mark.parametrize("case", sorted(CASES))
def test_artifacts_verify_refuses_a_manifest_field_of_the_wrong_type(tmp_path: Path, case: str) -> None:
    """A refused input, as install refuses it: one `error:` line naming the file and field, exit 2
    (it was one problem line and exit 1, like a checksum mismatch); `--json` the same."""
    change, expect = CASES[case]
    store = _store(tmp_path, change)
    for args in (["artifacts", "verify", str(store)], ["artifacts", "verify", "--json", str(store)]):
        result = _invoke(*args)
        where = f"{case}: {result.output!r} {result.exception!r}"
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit), where
        assert "Traceback" not in result.output, where
        assert result.output.splitlines() == [line for line in result.output.splitlines()
                                              if line.startswith("error: ")], where
        (line,) = result.output.splitlines()
        named = f"{store / f'nvidia-userspace-{V}-amd64.tar.zst'}:manifest.json"
        assert named in line and expect in line, where


def test_artifacts_verify_keeps_exit_1_for_a_checksum_problem(tmp_path: Path) -> None:
    """A well-formed artifact whose bytes differ from index.json is one of verify's problem lines."""
    store = _store(tmp_path, lambda data: None)
    index = json.loads((store / artifact.INDEX).read_text())
    entry = next(e for e in index["artifacts"] if e["kind"] == "userspace")
    entry["sha256"] = "0" * 64
    (store / artifact.INDEX).write_text(json.dumps(index))
    result = _invoke("artifacts", "verify", str(store))
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert lines and lines == [line for line in lines if "does not match" in line]


def test_a_valid_manifest_round_trips() -> None:
    m = ra.manifest_for(US_MEMBERS, kind="userspace", version=V)
    assert artifact.Manifest.from_json(m.to_json()) == m


@pytest.mark.parametrize("raw", [b"[]", b"5", b"null", b"{" * 100_000, b"\xff", b'{"kind": "kmod"'])
def test_not_a_manifest_object(raw: bytes) -> None:
    with pytest.raises(ArtifactError) as exc:
        artifact.Manifest.from_json(raw, source="x/manifest.json")
    assert str(exc.value).startswith("x/manifest.json: malformed manifest (")
    assert "\n" not in str(exc.value) and len(str(exc.value)) < 400


@pytest.mark.parametrize(("args", "message"), [
    (["install", "--driver", V + "\n", "--kernel", K],
     f"error: --driver: '{V}\\n' is not a full driver version"),
    (["install", "--driver", V, "--kernel", K + "\n"], f"error: --kernel: '{K}\\n' is not a kernel release"),
    (["install", "--driver", V, "--kernel", "../" + K], f"error: --kernel: '../{K}' is not a kernel release"),
    (["activate", V + "\n"], f"error: --driver: '{V}\\n' is not a full driver version"),
])
def test_version_and_kernel_options_refuse_a_trailing_newline(tmp_path: Path, args: list[str],
                                                              message: str) -> None:
    """`$` matches before a trailing newline: the patterns are applied with fullmatch."""
    store, root = tmp_path / "store", tmp_path / "root"
    store.mkdir()
    root.mkdir()
    extra = ["--store", str(store)] if args[0] == "install" else []
    result = _invoke(*args, *extra, "--root", str(root))
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(message), result.output
    assert list(root.iterdir()) == [], "nothing written under --root"
