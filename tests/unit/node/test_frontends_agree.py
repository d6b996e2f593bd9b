"""One profile, three front-ends, one plan: `nodeprep install --check --json`, bootstrap's driver
step in check mode and nodeprep.fleet.nodeprep_driver in check mode (run by ansible-core, the
library from this checkout) plan the same install for the same profile on the same image root,
because each is one call of nodeprep.node.usecase.install_driver.

The store is a directory of small real artifacts (tests/support/standin.py) served over loopback
http, so the store client reads the profile's credentials file; that file is the node's (in the
image, beneath --root), which this machine does not have: a front-end that read it on this machine
fails or plans otherwise. Nothing GPU-like is used (no NVML mock, no capture)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeprep.bootstrap.steps import Context, Options, step_driver
from nodeprep.errors import NodeprepError
from nodeprep.profile.load import load_profile
from tests.support.clirunner import separate_stderr
from tests.support.httpdir import serve_directory
from tests.support.standin import KERNEL, standin_store, tree

VERSION = "535.309.01"


def _cli(root: Path, profile: Path) -> dict[str, Any]:
    from nodeprep.cli import main

    r = separate_stderr().invoke(main, ["install", "--root", str(root), "--profile", str(profile),
                                        "--activate", "--check", "--json"])
    return dict(json.loads(r.stdout)) if r.exit_code == 0 else {"failed": r.stderr.strip()}


def _bootstrap(root: Path, profile: Path) -> dict[str, Any]:
    ctx = Context(root=root, profile=load_profile(profile), profile_path=profile, digest="",
                  options=Options(check=True))
    try:
        data = step_driver(ctx)
    except NodeprepError as e:
        return {"failed": str(e)}
    data.pop("summary")
    return data


def _ansible(root: Path, profile: Path) -> dict[str, Any]:
    from tests.unit.fleet.test_module_sequence import module

    driver = yaml.safe_load(profile.read_text())["driver"]
    status, result = module("nodeprep_driver", {"root": str(root), "state": "active", **driver}, check=True)
    return dict(result["plan"]) if status in ("CHANGED", "SUCCESS") else {"failed": result.get("msg")}


FRONT_ENDS = {"cli": _cli, "bootstrap": _bootstrap, "ansible": _ansible}

# the profile's driver section beyond the store, the kernel and the credentials file
PROFILES = {
    "pinned": {"version": VERSION},
    "branch": {"branch": "535", "keep_boot_kernel": True},
    "pinned-modules": {"version": VERSION, "branch_policy": "oldest", "modules": ["nvidia", "nvidia-uvm"]},
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    work = tmp_path_factory.mktemp("frontends")
    store = standin_store(work / "work", work / "store", VERSION)
    with serve_directory(store) as url:
        yield url


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_three_front_ends_plan_the_same_install(name: str, served: str, tmp_path: Path) -> None:
    pytest.importorskip("ansible")
    root = tmp_path / "image"
    # the node's credentials file: only in the image (a name this machine has no file at)
    auth = f"/etc/nodeprep/registry-auth-{tmp_path.name}.json"
    on_node = root / auth.lstrip("/")
    on_node.parent.mkdir(parents=True)
    on_node.write_text('{"auths": {}}\n')
    on_node.chmod(0o600)
    assert not Path(auth).exists()
    driver = {"store": served, "kernel": KERNEL, "registry_auth": auth, **PROFILES[name]}
    profile = root / "etc/nodeprep/node.yaml"
    profile.write_text(yaml.safe_dump({"driver": driver}))
    before = tree(root)
    plans = {fe: run(root, profile) for fe, run in FRONT_ENDS.items()}
    assert tree(root) == before  # check mode everywhere: nothing written
    assert all("failed" not in plan for plan in plans.values()), plans
    assert plans["cli"]["install_userspace"] and plans["cli"]["version"] == VERSION, plans["cli"]
    assert plans["cli"]["kernel_hook"]["record"]["registry_auth"] == auth  # as the booted node sees it
    assert plans["bootstrap"] == plans["cli"]
    assert plans["ansible"] == plans["cli"]
