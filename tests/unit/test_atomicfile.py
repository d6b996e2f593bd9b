"""The one atomic writer's stream and publish forms (nodeprep.atomicfile), which the artifacts, their
store, the downloads and the builder use: the file appears whole with its mode, or not at all, and
a link at its name is replaced, never written through. Real files in a temporary directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nodeprep.atomicfile import atomic_stream, publish_file


def test_a_stream_appears_whole_with_its_mode(tmp_path: Path) -> None:
    dest = tmp_path / "a.tar.zst"
    with atomic_stream(dest) as f:
        f.write(b"part one, ")
        assert not dest.exists()  # nothing at the name until the block ends
        f.write(b"part two")
    assert dest.read_bytes() == b"part one, part two"
    assert dest.stat().st_mode & 0o7777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tar.zst"]


def test_a_failed_stream_leaves_the_old_file(tmp_path: Path) -> None:
    dest = tmp_path / "index.json"
    dest.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_stream(dest) as f:
        f.write(b"new, half")
        raise RuntimeError("killed halfway")
    assert dest.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.json"]


def test_a_link_at_the_name_is_replaced_not_written_through(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep")
    dest = tmp_path / "store" / "x"
    dest.parent.mkdir()
    dest.symlink_to(outside)
    with atomic_stream(dest) as f:
        f.write(b"mine")
    assert not dest.is_symlink() and dest.read_bytes() == b"mine"
    assert outside.read_bytes() == b"keep"


def test_publish_a_finished_file(tmp_path: Path) -> None:
    done = tmp_path / "x.part"
    done.write_bytes(b"downloaded")
    os.chmod(done, 0o600)
    publish_file(done, tmp_path / "x", mode=0o644)
    assert (tmp_path / "x").read_bytes() == b"downloaded" and not done.exists()
    assert (tmp_path / "x").stat().st_mode & 0o7777 == 0o644
    link = tmp_path / "link.part"
    link.symlink_to(tmp_path / "x")
    with pytest.raises(OSError):  # a link left at a finished file's name is never published
        publish_file(link, tmp_path / "y")
    assert not (tmp_path / "y").exists()
