"""playbooks/site.yml for real, over SSH (OpenSSH and paramiko), against three network-namespace
test hosts: converge, check every artifact it leaves on each host, then converge again with
changed=0 everywhere. See conftest.py for the stand-ins (GPU capture, image root, dry-run join)."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeprep import runner
from tests.support import testhosts

from .conftest import CA_PIN, IMAGE_ROOT, TOKEN, Store, fleet_vars, write_inventory

pytestmark = pytest.mark.slow


def _find_runtimes(doc: Any) -> dict[str, Any]:
    """Every `runtimes` table in a containerd config, merged."""
    found: dict[str, Any] = {}
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key == "runtimes" and isinstance(value, dict):
                found.update(value)
            else:
                found.update(_find_runtimes(value))
    return found


def assert_host_prepared(host: testhosts.TestHost, version: str, kernel: str) -> None:
    image = host.root / IMAGE_ROOT.lstrip("/")
    # nodeprep itself
    assert (host.root / "usr/local/lib/nodeprep/lib/nodeprep/cli.py").is_file()
    assert (host.root / "usr/local/bin/nodeprep").read_text().startswith("#!/bin/sh")
    profile = yaml.safe_load((image / "etc/nodeprep/node.yaml").read_text())
    assert profile["driver"]["version"] == version and profile["cluster"]["node_name"] == host.name
    # driver root, activation, modules, ld cache
    vroot = image / "opt/nvidia" / version
    assert os.readlink(image / "opt/nvidia/current") == version
    assert (vroot / "lib64" / f"libcuda.so.{version}").is_file()
    ko = vroot / "modules" / kernel / "nvidia.ko"
    assert runner.run(["modinfo", "-F", "version", ko]).stdout.strip() == version
    cache = runner.run(["ldconfig", "-p", "-C", image / "etc/ld.so.cache"]).stdout
    libcuda = [line for line in cache.splitlines() if line.strip().startswith("libcuda.so.1 ")]
    assert libcuda and "/opt/nvidia/" in libcuda[0], cache[:2000]
    state = yaml.safe_load((image / "var/lib/nodeprep/state.json").read_text())
    assert state["active"] == version
    # labels for NFD (GPU facts from the recorded capture, driver from the image root)
    nfd = dict(
        line.split("=", 1)
        for line in (image / "etc/kubernetes/node-feature-discovery/features.d/nodeprep")
        .read_text()
        .splitlines()
        if line and not line.startswith("#")
    )
    assert nfd["nvidia.com/gpu.product"].startswith("NVIDIA-A100-SXM4-80GB"), nfd
    assert nfd["nodeprep.dev/driver-version"] == version
    assert nfd["example.com/pool"] == "fleet-test"
    # containerd drop-in with the nvidia runtime, CDI spec for the active root
    drop_ins = sorted((image / "etc/containerd/conf.d").glob("*.toml"))
    assert drop_ins, "no containerd drop-in"
    runtimes = _find_runtimes(tomllib.loads(drop_ins[0].read_text()))
    assert "nvidia" in runtimes, runtimes
    cdi = yaml.safe_load((image / "etc/cdi/nvidia.yaml").read_text())
    assert cdi["kind"] == "nvidia.com/gpu" and cdi["devices"]
    # join configuration (dry run: written, kubeadm not run), token only in 0600 files
    join_path = image / "etc/nodeprep/kubeadm-join.yaml"
    assert join_path.stat().st_mode & 0o777 == 0o600
    docs = list(yaml.safe_load_all(join_path.read_text()))
    join = next(d for d in docs if d and d.get("kind") == "JoinConfiguration")
    assert join["apiVersion"] == "kubeadm.k8s.io/v1beta4"
    assert join["nodeRegistration"]["name"] == host.name
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in join["nodeRegistration"][
        "taints"
    ]
    assert CA_PIN in join["discovery"]["bootstrapToken"]["caCertHashes"]
    token_file = image / "etc/nodeprep/bootstrap-token"
    assert token_file.read_text().strip() == TOKEN and token_file.stat().st_mode & 0o777 == 0o600
    assert not (image / "etc/kubernetes/kubelet.conf").exists()


@pytest.mark.parametrize("connection", ["ssh", "paramiko"])
def test_site_converges_then_reports_no_change(
    connection: str, fleet3: testhosts.Fleet, site_store: Store, source_snapshot: Path, tmp_path: Path
) -> None:
    version, kernel = site_store.versions[0], site_store.kernel
    with testhosts.serve_directory(site_store.path, fleet3) as urls:
        inventory = write_inventory(
            fleet3,
            tmp_path / "inventory.yml",
            fleet_vars(tmp_path, source_snapshot, version, kernel),
            {h.name: {"nvidia_driver_store": urls[h.name]} for h in fleet3.hosts},
        )
        if connection == "ssh":  # check mode on fresh hosts: everything would change, nothing is written
            dry = testhosts.ansible_playbook(
                fleet3, "playbooks/site.yml", inventory, connection=connection, args=["--check"]
            )
            assert dry.returncode == 0, dry.output[-6000:]
            assert all(dry.recap[h.name]["changed"] > 0 for h in fleet3.hosts), dry.recap
            for host in fleet3.hosts:
                assert not (host.root / "usr/local/lib/nodeprep").exists()
                image = host.root / IMAGE_ROOT.lstrip("/")
                assert sorted(p.name for p in image.iterdir()) == ["etc", "usr"]
                assert sorted(p.name for p in (host.root / IMAGE_ROOT.lstrip("/") / "etc").iterdir()) == [
                    "ld.so.conf",
                    "os-release",
                ]

        first = testhosts.ansible_playbook(fleet3, "playbooks/site.yml", inventory, connection=connection)
        assert first.returncode == 0, first.output[-6000:]
        assert sorted(first.recap) == ["node1", "node2", "node3"]
        for name, counts in first.recap.items():
            assert counts["failed"] == 0 and counts["unreachable"] == 0, (name, counts)
            assert counts["changed"] > 0, (name, counts)
        assert TOKEN not in first.output, "the bootstrap token leaked into ansible's output"
        for host in fleet3.hosts:
            assert_host_prepared(host, version, kernel)

        second = testhosts.ansible_playbook(fleet3, "playbooks/site.yml", inventory, connection=connection)
        assert second.returncode == 0, second.output[-6000:]
        assert {n: c["changed"] for n, c in second.recap.items()} == {"node1": 0, "node2": 0, "node3": 0}, (
            second.changed_tasks()
        )
        assert all(c["failed"] == 0 for c in second.recap.values())
        print(f"first run ({connection}):", first.recap, f"\nsecond run ({connection}):", second.recap)

        if connection == "ssh":  # check mode on a converged fleet: nothing would change
            check = testhosts.ansible_playbook(
                fleet3, "playbooks/site.yml", inventory, connection=connection, args=["--check", "--diff"]
            )
            assert check.returncode == 0, check.output[-6000:]
            assert {n: c["changed"] for n, c in check.recap.items()} == {
                "node1": 0,
                "node2": 0,
                "node3": 0,
            }, check.changed_tasks()
