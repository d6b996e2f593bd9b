"""The OCI registry store from the other front-ends, against the session's real registry (see
conftest.py): the Ansible role `nvidia_driver` (ansible-playbook, this checkout's collection, a local
connection installing into an image root), and cloud-init user-data whose write_files carry the
registry credentials (0600) and CA, applied by cloud-init's own code into a Debian rootfs, followed
by `nodeprep bootstrap` reading `driver.store: oci://...` from the profile.

Stand-ins, each at one boundary, as in tests/slow/bootstrap: the GPU is a recorded `nvidia-smi -q
-x` capture, and there is no API server (dry-run join)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from nodeprep import cloudinit, runner
from tests.slow.bootstrap.test_cloud_bootstrap import (
    FIXTURE,
    ROOTFS_EXTRA,
    TOKEN,
    apply_user_data,
    nodeprep,
    steps_of,
    write_profile,
)
from tests.support.testhosts import debian_rootfs

from .conftest import Published

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]


def test_ansible_role_installs_from_the_registry(published: Published, tmp_path: Path) -> None:
    p = published
    root = tmp_path / "image"
    # the task's registry_auth and ca_file name files on the node: in the image, read beneath its root
    (root / "etc/nodeprep").mkdir(parents=True)
    shutil.copyfile(p.auth, root / "etc/nodeprep/registry-auth.json")
    (root / "etc/nodeprep/registry-auth.json").chmod(0o600)
    shutil.copyfile(p.registry.ca, root / "etc/nodeprep/store-ca.pem")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"gpu-node-1": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    playbook = tmp_path / "driver.yml"
    playbook.write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False,
                                         "roles": [{"role": "nvidia_driver"}]}]))
    extra = {
        "nvidia_driver_version": p.version, "nvidia_driver_store": p.location,
        "nvidia_driver_registry_auth": "/etc/nodeprep/registry-auth.json",
        "nvidia_driver_ca_file": "/etc/nodeprep/store-ca.pem",
        "nvidia_driver_root": str(root), "nvidia_driver_kernel": p.kernel,
        "nvidia_driver_doctor_checks": ["state"], "nvidia_driver_nodeprep_path": str(REPO),
        "nvidia_driver_keep_boot_kernel": True,
    }
    env = {"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_HOME": str(tmp_path / ".ansible"),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_STDOUT_CALLBACK": "default"}
    argv = [sys.executable, "-m", "ansible.cli.playbook", "-i", inventory, "-e", json.dumps(extra), playbook]
    first = runner.run(argv, check=False, timeout=600, cwd=REPO, env=env, inherit_env=True)
    assert first.returncode == 0, first.stdout[-3000:]
    assert "changed=1" in first.stdout, first.stdout[-2000:]
    assert os.readlink(root / "opt/nvidia/current") == p.version
    assert (root / "opt/nvidia" / p.version / "modules" / p.kernel / "nvidia.ko").is_file()
    # the role leaves the kernel hook, with what it needs recorded (tests/slow/node/test_kernel_hook.py)
    assert os.access(root / "etc/kernel/postinst.d/nodeprep", os.X_OK)
    hook = json.loads((root / "var/lib/nodeprep/state.json").read_text())["kernel_hook"]
    assert hook["store"] == p.location and hook["registry_auth"] == "/etc/nodeprep/registry-auth.json"
    assert hook["keep_boot_kernel"] is True
    second = runner.run(argv, check=False, timeout=600, cwd=REPO, env=env, inherit_env=True)
    assert second.returncode == 0 and "changed=0" in second.stdout, second.stdout[-2000:]
    assert "s3cret" not in first.stdout + second.stdout


def test_cloud_init_writes_registry_credentials_and_bootstrap_installs_from_the_registry(
        real_build, published: Published, test_cache: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    p = published
    profile = write_profile(tmp_path / "node.yaml", real_build, p.location)
    data = yaml.safe_load(profile.read_text())
    data["driver"].update(registry_auth="/etc/nodeprep/registry-auth.json",
                          ca_file="/etc/nodeprep/store-ca.pem")
    profile.write_text(yaml.safe_dump(data, sort_keys=False))
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    user_data = tmp_path / "user-data"
    nodeprep("cloud-init", "--profile", profile, "--token-file", token_file, "--nodeprep-from", "index",
             "--registry-auth", p.auth, "--ca-file", p.registry.ca, "--out", user_data, check=True)
    assert user_data.stat().st_mode & 0o777 == 0o600
    refused = nodeprep("cloud-init", "--profile", profile, "--out", tmp_path / "ud2")  # store mode
    assert refused.returncode == 2 and "use --nodeprep-from index" in refused.stderr

    root = debian_rootfs(test_cache, tmp_path / "root", extra_packages=ROOTFS_EXTRA)
    apply_user_data(user_data, root, tmp_path / "applied.json")
    node_auth = root / "etc/nodeprep/registry-auth.json"
    assert node_auth.read_bytes() == p.auth.read_bytes() and node_auth.stat().st_mode & 0o777 == 0o600
    node_ca = root / "etc/nodeprep/store-ca.pem"
    assert node_ca.read_bytes() == p.registry.ca.read_bytes()

    argv = ["bootstrap", "--root", root, "--profile", root / cloudinit.PROFILE_PATH.lstrip("/"),
            "--dry-run-join", "--nvidia-smi-xml", FIXTURE, "--json"]
    r = nodeprep(*argv)
    assert r.returncode == 0, r.stderr
    assert steps_of(r) == {s: "done" for s in ("driver", "modules", "mig", "labels", "runtime", "join")}
    assert os.readlink(root / "opt/nvidia/current") == p.version
    assert "s3cret" not in r.stdout + r.stderr
    # bootstrap leaves the kernel hook; the files it records are the node's own (no --root prefix)
    assert os.access(root / "etc/kernel/postinst.d/nodeprep", os.X_OK)
    hook = json.loads((root / "var/lib/nodeprep/state.json").read_text())["kernel_hook"]
    assert hook["registry_auth"] == "/etc/nodeprep/registry-auth.json" and hook["keep_boot_kernel"] is False
