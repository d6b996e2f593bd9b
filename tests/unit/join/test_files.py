"""Planned writes: atomic, mode-exact from the first byte, and confined to --root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nodeprep.errors import InputError
from nodeprep.runtime.files import FileChange, apply_changes, under

from .conftest import mode_of


def test_write_compare_rewrite(tmp_path: Path) -> None:
    change = FileChange(
        under(tmp_path, "/etc/x/secret.yaml"), "/etc/x/secret.yaml", b"token: s3cret\n", 0o600, True
    )
    assert change.changed and change.before is None
    assert "s3cret" not in repr(change) and "s3cret" not in str(change.summary())
    assert apply_changes([change]) == [change]
    assert mode_of(tmp_path / "etc/x/secret.yaml") == 0o600
    assert not change.changed and apply_changes([change]) == []
    (tmp_path / "etc/x/secret.yaml").chmod(0o644)  # a mode drift alone is a change
    assert change.changed and apply_changes([change]) == [change]
    assert mode_of(tmp_path / "etc/x/secret.yaml") == 0o600
    assert sorted(os.listdir(tmp_path / "etc/x")) == ["secret.yaml"]  # no temp files left


def test_paths_resolve_beneath_the_root(tmp_path: Path) -> None:
    """An image's links lead where they lead on the booted node: an absolute one (an image's
    /var/run -> /run) and a `../..` one resolve inside the root, never on the host (issue #25)."""
    root = tmp_path / "image"
    (root / "var").mkdir(parents=True)
    outside = tmp_path / "host-run"
    outside.mkdir()
    (root / "var/run").symlink_to(outside)  # absolute: the node sees ROOT<outside>
    assert under(root, "/var/run/cdi/nvidia.yaml") == root / str(outside).lstrip("/") / "cdi/nvidia.yaml"
    (root / "var/run3").symlink_to("../../../../../../../../../host-run")
    assert under(root, "/var/run3/cdi/nvidia.yaml") == root / "host-run/cdi/nvidia.yaml"
    (root / "run").mkdir()
    (root / "var/run2").symlink_to("../run")  # relative links inside the root are fine
    assert under(root, "/var/run2/cdi/nvidia.yaml") == root / "run/cdi/nvidia.yaml"
    assert under(Path("/"), "/etc/cdi/nvidia.yaml") == Path("/etc/cdi/nvidia.yaml")
    (root / "var/loop").symlink_to("loop")
    with pytest.raises(InputError, match="cluster.token_file: /var/loop/x under --root .*: Too many levels"):
        under(root, "/var/loop/x", input_field="cluster.token_file")
    change = FileChange(under(root, "/var/run/cdi/nvidia.yaml"), "/var/run/cdi/nvidia.yaml", b"spec\n")
    assert apply_changes([change]) == [change]
    assert os.listdir(outside) == []
    assert (root / str(outside).lstrip("/") / "cdi/nvidia.yaml").read_bytes() == b"spec\n"
