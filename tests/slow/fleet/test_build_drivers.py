"""playbooks/build-drivers.yml (role driver_build, module nodeprep_build) for real on the controller
itself (connection local): it asks the library to build the shared real build's request again, so
the input digest matches and nothing compiles; the role must report changed=0 and the store must
still list the same artifact. (The test hosts have no route to the Debian archive, so builds run
on the controller here.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from nodeprep import runner
from tests.support.testhosts import REPO, parse_recap

pytestmark = pytest.mark.slow


def test_rebuilding_the_same_inputs_reports_no_change(real_build, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("ansible")
    before = json.loads((real_build.store / "index.json").read_text())
    inventory = {
        "all": {
            "children": {
                "build_hosts": {
                    "hosts": {
                        "localhost": {
                            "ansible_connection": "local",
                            "ansible_python_interpreter": sys.executable,
                            "driver_build_versions": [real_build.driver_version],
                            "driver_build_kernels": [],  # the default kernel, like the shared build
                            "driver_build_flavour": real_build.flavour,
                            "driver_build_store_dir": str(real_build.store),
                            "driver_build_cache_dir": str(real_build.cache),
                            "driver_build_smoke_test": "false",
                            "driver_build_manage_packages": False,
                            "driver_build_nodeprep_path": str(
                                REPO
                            ),  # the controller's checkout, no install needed
                        }
                    }
                }
            }
        }
    }
    inv = tmp_path / "inventory.yml"
    inv.write_text(yaml.safe_dump(inventory))
    r = runner.run(
        [
            sys.executable,
            "-m",
            "ansible.cli.playbook",
            "-i",
            inv,
            "--tags",
            "driver_build",
            REPO / "playbooks/build-drivers.yml",
        ],
        check=False,
        cwd=REPO,
        timeout=1800,
        inherit_env=True,
        env={"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    recap = parse_recap(r.stdout)
    assert recap["localhost"]["failed"] == 0 and recap["localhost"]["changed"] == 0, recap
    assert f"ok: [localhost] => (item={real_build.driver_version} / default kernel)" in r.stdout, r.stdout[
        -3000:
    ]
    after = json.loads((real_build.store / "index.json").read_text())
    assert [a["name"] for a in after["artifacts"]] == [a["name"] for a in before["artifacts"]]
    assert real_build.kmod.name in {a["name"] for a in after["artifacts"]}
