"""The Ansible modules write under `root` through the image's links as the booted node resolves them
(issue #25): ROOT/etc/nodeprep as an absolute link to a host directory gets nodeprep_profile's file
inside the root, and the host directory stays byte-identical."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.support.standin import tree
from tests.unit.node.test_root_reads_confined import linked_etc_nodeprep

from .test_module_sequence import CAPTURE, PROFILE, module


def test_profile_module_writes_beneath_the_root(tmp_path: Path) -> None:
    outside, root = tmp_path / "host-etc-nodeprep", tmp_path / "root"
    linked_etc_nodeprep(root, outside, "host: profile\n")
    before = tree(outside)
    status, result = module("nodeprep_profile", {"root": str(root), "content": PROFILE})
    assert status == "CHANGED", result
    assert tree(outside) == before
    inside = root / str(outside).lstrip("/") / "node.yaml"
    assert yaml.safe_load(inside.read_text()) == PROFILE
    assert module("nodeprep_profile", {"root": str(root), "content": PROFILE})[0] == "SUCCESS"


def test_a_link_loop_under_root_fails_the_module_with_one_message(tmp_path: Path) -> None:
    """under_root's refusal (a loop in the image) is a module failure naming the path, never a
    traceback, in every module that resolves a path under root: the profile, the install probe,
    the token file of the join and the labels' files."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/nodeprep").symlink_to("nodeprep")  # ELOOP
    before = tree(root)
    calls = [
        ("nodeprep_profile", {"root": str(root), "content": PROFILE}),
        ("nodeprep_info", {"root": str(root), "profile": PROFILE}),
        ("nodeprep_join", {"root": str(root), "token": "abcdef.0123456789abcdef", "dry_run": True}),
        ("nodeprep_labels", {"root": str(root), "cloud": "none", "nvidia_smi_xml": str(CAPTURE),
                             "json_file": "/etc/nodeprep/labels.json", "nfd_file": ""}),
    ]
    for name, args in calls:
        status, result = module(name, args)
        msg = str(result.get("msg"))
        assert status == "FAILED!", (name, result)
        assert "/etc/nodeprep" in msg and "Too many levels of symbolic links" in msg, (name, result)
        assert "\n" not in msg and "Traceback" not in json.dumps(result), (name, result)
        assert "exception" not in result and "module_stderr" not in result, (name, result)
        # fail_json with the library's error (an uncaught exception reads "Task failed: Module failed")
        assert result.get("error_type") == "InputError" and result.get("exit_code") == 2, (name, result)
        assert msg.startswith("/etc/nodeprep"), (name, result)
        assert "0123456789abcdef" not in json.dumps(result), name
    assert tree(root) == before
