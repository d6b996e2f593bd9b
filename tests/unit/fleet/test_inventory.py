"""The example inventory: Ansible renders its node profile for a GPU node, and nodeprep's own profile
parser accepts it (the same validation the nodeprep_profile module runs on the node)."""

from __future__ import annotations

import json
import sys

import pytest

from nodeprep import runner
from nodeprep.profile import parse_profile

from .conftest import REPO


def _render(host: str, var: str) -> object:
    pytest.importorskip("ansible")
    r = runner.run(
        [
            sys.executable,
            "-m",
            "ansible.cli.adhoc",
            "-i",
            REPO / "inventories/example/hosts.yml",
            host,
            "-m",
            "ansible.builtin.debug",
            "-a",
            f"var={var}",
            "-o",
        ],
        cwd=REPO,
        timeout=120,
        inherit_env=True,
        env={"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
    )
    line = next(x for x in r.stdout.splitlines() if x.startswith(host))
    return json.loads(line.split("=>", 1)[1])[var]


def test_example_inventory_renders_a_valid_profile() -> None:
    data = _render("gpu-a-01", "nodeprep_install_profile")
    profile = parse_profile(data, source="inventories/example")
    assert profile.driver.version == "535.309.01"
    assert profile.cluster is not None and profile.cluster.node_name == "gpu-a-01"
    assert profile.labels.cloud == "none"


def test_example_inventory_pins_no_kernel_release() -> None:
    """A kernel release written into the example goes stale when the archive drops it (it named
    6.1.0-41-amd64 long after that left); the example resolves the current one at build time."""
    import re

    release = re.compile(r"\d+\.\d+\.\d+[-+][\w.+~-]+")  # 6.1.0-41-amd64, 6.12.117+deb13-amd64
    for path in sorted((REPO / "inventories").rglob("*.yml")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            value = line.split("#")[0].strip().lstrip("- ").strip("'\"")
            assert not release.fullmatch(value), f"{path.relative_to(REPO)}:{n}: {value}"
