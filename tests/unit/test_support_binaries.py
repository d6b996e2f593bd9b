"""tests/support/binaries.py, which gives the tests the real Kubernetes and NVIDIA binaries: a
compressed binary is decompressed once into the cache and only when its sha256 is the listed one."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import zstandard

from tests.support import binaries


def test_verified_decompresses_once_and_refuses_another_binary(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "bin"
    src.mkdir()
    good, bad = b"\x7fELF the real one\n", b"\x7fELF another one\n"
    (src / "tool.zst").write_bytes(zstandard.ZstdCompressor().compress(good))
    (src / "other.zst").write_bytes(zstandard.ZstdCompressor().compress(bad))
    sha = tmp_path / "list.sha256"
    sha.write_text(f"{hashlib.sha256(good).hexdigest()}  tool\n{hashlib.sha256(good).hexdigest()}  other\n")
    monkeypatch.setenv("NODEPREP_TEST_BINARIES", str(src))
    cache = tmp_path / "cache"

    (path,) = binaries.verified("NODEPREP_TEST_BINARIES", ("tool",), sha, cache).values()
    assert path.read_bytes() == good and path.stat().st_mode & 0o111
    assert path == cache / hashlib.sha256(good).hexdigest() / "tool"
    (src / "tool.zst").unlink()  # decompressed once: the cached copy is used from now on
    assert binaries.verified("NODEPREP_TEST_BINARIES", ("tool",), sha, cache)["tool"] == path

    with pytest.raises(RuntimeError, match="other.zst: sha256 differs from list.sha256"):
        binaries.verified("NODEPREP_TEST_BINARIES", ("other",), sha, cache)
    assert not list(cache.glob("*/other*"))
    assert binaries.missing("NODEPREP_TEST_BINARIES", ("tool", "other", "third")) == ["tool", "third"]


def test_the_skip_reasons_name_the_variable_the_file_or_the_digest(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    env, what = "NODEPREP_TEST_BINARIES", "a directory with test tools"
    monkeypatch.delenv(env, raising=False)
    unset = f"{env} is not set: it names {what}"
    assert binaries.unavailable(env, ("tool",), what) == unset
    assert binaries.pinned(env, what, "tool", "0" * 64, ": differs") == unset
    monkeypatch.setenv(env, str(tmp_path))
    assert binaries.unavailable(env, ("tool", "other"), what) == f"{env}={tmp_path} lacks tool, other"
    assert binaries.pinned(env, what, "tool", "0" * 64, ": differs") == f"{env}={tmp_path} has no tool"
    (tmp_path / "tool").write_bytes(b"the tool\n")
    (tmp_path / "other.zst").write_bytes(b"")
    assert binaries.unavailable(env, ("tool", "other"), what) is None
    assert binaries.pinned(env, what, "tool", "0" * 64, ": differs") == f"{tmp_path / 'tool'}: differs"
    digest = hashlib.sha256(b"the tool\n").hexdigest()
    assert binaries.pinned(env, what, "tool", digest, ": differs") == tmp_path / "tool"
