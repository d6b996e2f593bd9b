"""The Ansible modules write under `root` through the image's links as the booted node resolves them
(issue #25): ROOT/etc/nodeprep as an absolute link to a host directory gets nodeprep_profile's file
inside the root, and the host directory stays byte-identical."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.support.standin import tree

from .test_module_sequence import PROFILE, module


def test_profile_module_writes_beneath_the_root(tmp_path: Path) -> None:
    outside = tmp_path / "host-etc-nodeprep"
    outside.mkdir()
    (outside / "node.yaml").write_text("host: profile\n")
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/nodeprep").symlink_to(outside)
    before = tree(outside)
    status, result = module("nodeprep_profile", {"root": str(root), "content": PROFILE})
    assert status == "CHANGED", result
    assert tree(outside) == before
    inside = root / str(outside).lstrip("/") / "node.yaml"
    assert yaml.safe_load(inside.read_text()) == PROFILE
    assert module("nodeprep_profile", {"root": str(root), "content": PROFILE})[0] == "SUCCESS"
