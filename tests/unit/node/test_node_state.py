"""State reconciliation and crash-safe file primitives, on a real filesystem (tmp_path)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nodeprep.atomicfile import atomic_symlink, atomic_write, clean_temporaries
from nodeprep.errors import StateError
from nodeprep.node.layout import Layout
from nodeprep.node.state import State, load_state, save_state


def fake_version(root: Path, version: str, kernels: tuple[str, ...] = ("6.1.0-28-amd64",)) -> None:
    vdir = root / "opt/nvidia" / version
    (vdir / "lib64").mkdir(parents=True)
    (vdir / "manifest.json").write_text(json.dumps({"kind": "userspace", "input_digest": f"us-{version}"}))
    for k in kernels:
        (vdir / "modules" / k).mkdir(parents=True)
        (vdir / "modules" / k / "manifest.json").write_text(json.dumps({"input_digest": f"km-{version}-{k}"}))


def test_empty_root(tmp_path: Path) -> None:
    state = load_state(tmp_path)
    assert state == State() and state.to_dict()["installed"] == {}


def test_versions_found_without_state_file(tmp_path: Path) -> None:
    """A run killed between the rename of the version directory and the state write loses nothing."""
    fake_version(tmp_path, "535.309.01", ("6.1.0-28-amd64", "6.1.0-29-amd64"))
    (tmp_path / "opt/nvidia/.staging-535.216.03-123").mkdir()  # interrupted: not a version
    (tmp_path / "opt/nvidia/535.216.03").mkdir()  # no manifest: not complete, not ours
    state = load_state(tmp_path)
    assert list(state.installed) == ["535.309.01"]
    assert state.installed["535.309.01"].kernels == ("6.1.0-28-amd64", "6.1.0-29-amd64")
    assert state.installed["535.309.01"].input_digest == "us-535.309.01"
    assert state.active is None


def test_active_is_the_link_previous_from_state(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    fake_version(tmp_path, "535.309.01")
    fake_version(tmp_path, "535.216.03")
    os.symlink("535.309.01", layout.current)
    save_state(layout, State(active="535.216.03", previous="535.216.03"))
    state = load_state(tmp_path)
    assert state.active == "535.309.01" and state.previous == "535.216.03"
    # a previous equal to the active one (killed between state write and switch) is dropped
    save_state(layout, State(active="535.216.03", previous="535.309.01"))
    assert load_state(tmp_path).previous is None
    # a previous that is no longer installed is dropped
    save_state(layout, State(previous="525.147.05"))
    assert load_state(tmp_path).previous is None


def test_dangling_current_means_nothing_active(tmp_path: Path) -> None:
    fake_version(tmp_path, "535.309.01")
    os.symlink("535.216.03", Layout(tmp_path).current)
    assert load_state(tmp_path).active is None


def test_corrupt_state_file(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    layout.state_dir.mkdir(parents=True)
    layout.state_file.write_text("{not json")
    with pytest.raises(StateError, match="corrupt state file"):
        load_state(tmp_path)


def test_atomic_write_and_symlink(tmp_path: Path) -> None:
    f = tmp_path / "d" / "x.conf"
    assert atomic_write(f, "a\n") is True
    assert atomic_write(f, "a\n") is False
    assert f.read_text() == "a\n" and oct(f.stat().st_mode & 0o777) == "0o644"
    assert atomic_write(f, "b\n", mode=0o600) is True and f.read_text() == "b\n"
    link = tmp_path / "current"
    assert atomic_symlink(link, "535.309.01") is True
    assert atomic_symlink(link, "535.309.01") is False
    assert atomic_symlink(link, "535.216.03") is True and os.readlink(link) == "535.216.03"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current", "d"]


def test_clean_temporaries_only_touches_our_names(tmp_path: Path) -> None:
    (tmp_path / ".staging-535.309.01-99").mkdir()
    (tmp_path / ".staging-535.309.01-99" / "f").write_text("x")
    (tmp_path / ".tmp-00-nvidia.conf.12").write_text("x")
    (tmp_path / ".hidden-by-someone-else").write_text("x")
    (tmp_path / "535.309.01").mkdir()
    removed = clean_temporaries(tmp_path, (".staging-", ".tmp-"))
    assert sorted(p.name for p in removed) == [".staging-535.309.01-99", ".tmp-00-nvidia.conf.12"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hidden-by-someone-else", "535.309.01"]
