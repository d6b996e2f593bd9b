"""A corpus of malformed and hostile node profiles, each run through the three commands that read a
profile: `join --check`, `profile check` and `cloud-init`.

Every one must end the same way in all three: exit 2, exactly one `error:` line naming the file and
the field (or the line / limit when the file is not YAML at all), no traceback, nothing written under
`--root` (or to `--out` there), and the command returns (run in a thread with a generous join
timeout: a hang fails the test instead of stalling the suite).

The text cases are files under tests/unit/data/bad-profiles/ (first line `# expect: <substring>`);
encodings, binary garbage, nesting, size and FIFOs are generated below, where that is clearer.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import random
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result

from nodeprep.cli import main
from nodeprep.errors import InputFileError
from nodeprep.yamlinput import MAX_DEPTH, parse_yaml
from tests.support.clirunner import separate_stderr

DATA = Path(__file__).parent / "data" / "bad-profiles"
SECRET = "s3cr3t"  # the password in driver-store-credentials.yaml: never echoed
VALID = 'driver:\n  version: "550.90.07"\n  store: /srv/nodeprep-store\n'
INVALID_VERSION = 'driver:\n  version: "535"\n'


def _files() -> list[tuple[str, str]]:
    out = []
    for path in sorted(DATA.glob("*.yaml")):
        first = path.read_text(encoding="utf-8").split("\n", 1)[0]
        assert first.startswith("# expect: "), path
        out.append((path.name, first.removeprefix("# expect: ")))
    return out


def _generated() -> dict[str, tuple[str, Callable[[Path], None]]]:
    """name -> (expected substring, writer)."""

    def raw(data: bytes) -> Callable[[Path], None]:
        return lambda p: p.write_bytes(data)

    garbage = random.Random(18).randbytes(4096)
    return {
        "latin-1": ("not UTF-8", raw(VALID.encode() + 'labels:\n  extra:\n    example.com/x: "café"\n'
                                    .encode("latin-1"))),
        "binary-garbage": ("line 1", raw(garbage)),
        "binary-garbage-no-nul": ("not UTF-8", raw(garbage.replace(b"\x00", b"\xff"))),
        "nul-in-utf8": ("NUL", raw(VALID.encode() + b"labels:\x00\n")),
        "utf-16-no-bom": ("NUL", raw(INVALID_VERSION.encode("utf-16-le"))),
        "utf-16-be-no-bom": ("NUL", raw(INVALID_VERSION.encode("utf-16-be"))),
        "utf-32-no-bom": ("NUL", raw(INVALID_VERSION.encode("utf-32-le"))),
        # a byte order mark makes UTF-16/32 valid YAML: decoded, then validated like UTF-8
        "utf-16-bom-bad-field": ("driver.version", raw(INVALID_VERSION.encode("utf-16"))),
        "utf-32-bom-bad-field": ("driver.version", raw(INVALID_VERSION.encode("utf-32"))),
        "utf-8-bom-bad-field": ("driver.version", raw(codecs.BOM_UTF8 + INVALID_VERSION.encode())),
        "utf-16-bom-truncated": ("not valid UTF-16", raw(INVALID_VERSION.encode("utf-16") + b"\x41")),
        "nested-flow-sequences": ("nested deeper than", raw(b"driver: " + b"[" * 3000 + b"]" * 3000)),
        "nested-flow-mappings": ("nested deeper than", raw(b"driver: " + b"{a: " * 3000 + b"}" * 3000)),
        "nested-block-sequences": ("nested deeper than", raw(b"- " * 3000 + b"x\n")),
        "oversized-6MB": ("1 MiB limit", raw(VALID.encode() + b"#" + b"x" * (6 << 20) + b"\n")),
        "fifo": ("not a regular file", lambda p: os.mkfifo(p)),
        "unreadable-symlink-loop": ("cannot read", lambda p: os.symlink(p.name, p)),
    }


def _snapshot(root: Path) -> dict[str, tuple[int, str]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else ""
            out[str(p.relative_to(root))] = (st.st_mode, digest)
    return out


def _invoke(args: list[str]) -> Result:
    """Run the real CLI in-process, in a thread joined with a generous timeout (hang guard)."""
    box: dict[str, Result] = {}

    def target() -> None:
        box["result"] = separate_stderr().invoke(main, args)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), f"nodeprep {' '.join(args)} did not return"
    return box["result"]


COMMANDS = {
    "join": lambda f, r: ["join", "--check", "--profile", str(f), "--root", str(r)],
    "profile-check": lambda f, r: ["profile", "check", "--profile", str(f), "--root", str(r)],
    "cloud-init": lambda f, r: ["cloud-init", "--profile", str(f), "--out", str(r / "user-data")],
}


def _check(profile: Path, expect: str, root: Path) -> None:
    (root / "etc" / "nodeprep").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "nodeprep" / "keep").write_text("untouched\n")
    before = _snapshot(root)
    for name, argv in COMMANDS.items():
        result = _invoke(argv(profile, root))
        err = result.stderr
        out = result.stdout
        where = f"{name} on {profile.name}: stdout={out!r} stderr={err!r}"
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            f"{where}: raised {result.exception!r}")
        assert result.exit_code == 2, where
        assert "Traceback" not in out + err, where
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, where
        assert all(line.startswith("  ") for line in err.splitlines() if not line.startswith("error:")), where
        assert str(profile) in errors[0], where
        assert expect in errors[0], where
        assert SECRET not in out + err, where
        assert len(errors[0]) < 4000, where  # bounded, whatever the input holds
        assert _snapshot(root) == before, f"{where}: something was written under --root"


@pytest.mark.parametrize("name, expect", _files(), ids=[n for n, _ in _files()])
def test_bad_profile_file(tmp_path: Path, name: str, expect: str) -> None:
    _check(DATA / name, expect, tmp_path / "root")


GENERATED = _generated()


@pytest.mark.parametrize("name", sorted(GENERATED))
def test_bad_profile_generated(tmp_path: Path, name: str) -> None:
    expect, write = GENERATED[name]
    profile = tmp_path / f"{name}.yaml"
    write(profile)
    _check(profile, expect, tmp_path / "root")


def test_corpus_is_large_enough() -> None:
    assert len(_files()) + len(GENERATED) >= 40


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-32"])
def test_byte_order_marked_profile_is_accepted(tmp_path: Path, encoding: str) -> None:
    """YAML allows UTF-8/16/32 with a byte order mark: such a profile is read like UTF-8."""
    profile = tmp_path / "node.yaml"
    profile.write_bytes(("# GPU rack in Zürich\n" + VALID).encode(encoding))
    result = _invoke(["profile", "check", "--profile", str(profile), "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["driver"]["version"] == "550.90.07"


@pytest.mark.parametrize("depth", [65, 999, 1001, 3000, 20000])
@pytest.mark.parametrize("shape", ["[", "{a: "])
def test_deep_nesting_is_one_refusal_whichever_layer_refuses(shape: str, depth: int) -> None:
    """libyaml (PyYAML >= 6.0.3 wheels) has a depth limit of its own in its scanner and can refuse a
    deep flow collection before the composer's MAX_DEPTH does: the outcome is the same refusal at
    every depth past the limit, whichever layer stops it."""
    close = "]" if shape == "[" else "}"
    with pytest.raises(InputFileError) as exc:
        parse_yaml("driver: " + shape * depth + close * depth, source="deep.yaml")
    assert str(exc.value) == f"deep.yaml: line 1: nested deeper than {MAX_DEPTH} levels"
