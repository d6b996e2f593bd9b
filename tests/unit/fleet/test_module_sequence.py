"""The node-side modules run for real through Ansible (ad-hoc, connection local, the library from
this checkout, a temporary directory as the node's root), in ansible-core's integration sequence:
check -> changed, apply -> changed, re-apply -> unchanged, check -> unchanged; bad input fails
with one line naming the field and leaves the node as it was."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from nodeprep import runner

from .conftest import REPO

CAPTURE = REPO.parent / "shared/fixtures/nvidia-smi/a100-sxm4-80gb-mig_535.54.03.xml"


def module(name: str, args: dict[str, object], *, check: bool = False) -> tuple[str, dict[str, object]]:
    """Run nodeprep.fleet.<name> on localhost; (status word, result)."""
    pytest.importorskip("ansible")
    argv = [
        sys.executable,
        "-m",
        "ansible.cli.adhoc",
        "-i",
        "localhost,",
        "localhost",
        "-c",
        "local",
        "-e",
        f"ansible_python_interpreter={sys.executable}",
        "-m",
        f"nodeprep.fleet.{name}",
        "-a",
        json.dumps({"nodeprep_path": str(REPO), **args}),
        "-o",
        "--diff",
    ]
    if check:
        argv.append("--check")
    r = runner.run(
        argv,
        check=False,
        cwd=REPO,
        timeout=120,
        inherit_env=True,
        env={"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
    )
    line = next(x for x in r.stdout.splitlines() if x.startswith("localhost |"))
    status, _, payload = line[len("localhost | ") :].partition(" => ")
    return status.strip(), json.loads(payload)


PROFILE = {
    "driver": {"version": "535.309.01", "store": "https://store.example.invalid/nvidia"},
    "labels": {"cloud": "none", "extra": {"example.com/pool": "a"}},
}


def test_profile_module_sequence(tmp_path: Path) -> None:
    args = {"root": str(tmp_path), "content": PROFILE}
    target = tmp_path / "etc/nodeprep/node.yaml"
    assert module("nodeprep_profile", args, check=True)[0] == "CHANGED" and not target.exists()
    status, result = module("nodeprep_profile", args)
    assert status == "CHANGED" and result["profile"]["driver"]["flavour"] == "proprietary"
    assert yaml.safe_load(target.read_text()) == PROFILE
    assert module("nodeprep_profile", args)[0] == "SUCCESS"
    assert module("nodeprep_profile", args, check=True)[0] == "SUCCESS"
    before = target.read_bytes()
    bad = {"root": str(tmp_path), "content": {"driver": {"version": "535"}, "labels": {"cloud": "moon"}}}
    status, result = module("nodeprep_profile", bad)
    assert status == "FAILED!" and result["exit_code"] == 2
    assert "driver.version" in str(result["msg"]) and "labels.cloud" in str(result["msg"])
    assert target.read_bytes() == before


def test_labels_module_sequence(tmp_path: Path) -> None:
    args = {
        "root": str(tmp_path),
        "cloud": "none",
        "nvidia_smi_xml": str(CAPTURE),
        "kernel": "6.1.0-41-amd64",
        "extra": {"example.com/pool": "a"},
    }
    nfd = tmp_path / "etc/kubernetes/node-feature-discovery/features.d/nodeprep"
    assert module("nodeprep_labels", args, check=True)[0] == "CHANGED" and not nfd.exists()
    status, result = module("nodeprep_labels", args)
    assert status == "CHANGED"
    written = dict(line.split("=", 1) for line in nfd.read_text().splitlines() if not line.startswith("#"))
    assert written["nvidia.com/gpu.product"].startswith("NVIDIA-A100-SXM4-80GB")
    assert written == {k: v for k, v in result["labels"].items() if k in written}
    doc = json.loads((tmp_path / "var/lib/nodeprep/labels.json").read_text())
    assert doc["labels"] == result["labels"] and set(doc["kubelet"]) | set(doc["api"]) == set(doc["labels"])
    assert module("nodeprep_labels", args)[0] == "SUCCESS"
    assert module("nodeprep_labels", args, check=True)[0] == "SUCCESS"
    status, result = module("nodeprep_labels", {**args, "extra": {"bad key!": "x"}})
    assert status == "FAILED!" and "bad key!" in str(result["msg"]) and result["exit_code"] == 2


def test_doctor_module_fails_with_the_problems(tmp_path: Path) -> None:
    status, result = module("nodeprep_doctor", {"root": str(tmp_path), "checks": ["state"]})
    assert status == "FAILED!" and str(result["msg"]).startswith("doctor: state:")
    assert result["changed"] is False
