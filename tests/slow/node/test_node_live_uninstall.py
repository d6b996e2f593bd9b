"""`nodeprep uninstall` on a LIVE root where join set the kubelet up (issue 28): nodeprep runs chrooted
in a Debian 12 host (the test hosts' cached rootfs, tests/support/testhosts.py, python3 and
nodeprep's dependencies from Debian) with no --root, as on a booted node. The host has no systemd; a
stand-in `systemctl` at /usr/local/bin (an external tool's stand-in) records each argv and whether
the kubelet's KubeletConfiguration was still there when it ran. A stand-in driver's install,
`runtime` and a kubelet-mode `join` are made from outside with --root (the fast tests' path).
Uninstall's plan says it stops the kubelet; the run asks systemd whether it is active and stops it
before its files go, not when it is inactive; with no systemctl it says so in one line and removes
the files all the same."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.standin import KERNEL, standin_store
from tests.support.testhosts import debian_rootfs
from tests.unit.node.test_node_uninstall import CA_PIN, JOIN_TOKEN, VERSION, install_everything, join_root

from .helpers import REPO

pytestmark = pytest.mark.slow

PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
CONFIG = "var/lib/kubelet/config.yaml"
LOG = "run/systemctl-argv"
STANDIN = f"""#!/bin/sh
if [ -e /{CONFIG} ]; then files=present; else files=gone; fi
echo "$* ($files)" >> /{LOG}
case "$1" in is-active) exit "$(cat /run/kubelet-active)";; esac
exit 0
"""


@pytest.fixture(scope="module")
def host(test_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The host's root with nodeprep's sources at /opt/nodeprep-src, a stand-in driver's store at
    /srv/store, a cluster in the node profile (kubelet mode), its token and CA certificate, and the
    kubelet package's unit."""
    work = tmp_path_factory.mktemp("live")
    root = debian_rootfs(test_cache, work / "host")
    standin_store(work, root / "srv/store", VERSION)
    (root / f"lib/modules/{KERNEL}/kernel").mkdir(parents=True)
    shutil.copytree(REPO / "nodeprep", root / "opt/nodeprep-src/nodeprep",
                    ignore=shutil.ignore_patterns("__pycache__"))
    cluster = {"api_server": "10.0.0.10:6443", "mode": "kubelet", "kubernetes_version": "1.30",
               "ca_cert_hashes": [CA_PIN]}
    (root / "etc/nodeprep").mkdir(parents=True)
    profile = {"driver": {"version": VERSION}, "cluster": cluster}
    (root / "etc/nodeprep/node.yaml").write_text(yaml.safe_dump(profile))
    (root / "etc/nodeprep/bootstrap-token").write_text(JOIN_TOKEN + "\n")
    (root / "etc/nodeprep/bootstrap-token").chmod(0o600)
    (root / "etc/kubernetes/pki").mkdir(parents=True)
    (root / "etc/kubernetes/pki/ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (root / "lib/systemd/system/kubelet.service").write_text("[Service]\nExecStart=/usr/bin/kubelet\n"
                                                            "[Install]\nWantedBy=multi-user.target\n")
    return root


def inside(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["chroot", str(root), "python3", "-m", "nodeprep.cli", *args], capture_output=True,
                          text=True, timeout=300,
                          env={"PATH": PATH, "PYTHONPATH": "/opt/nodeprep-src", "LANG": "C.UTF-8"})


def joined(root: Path, standin: str | None) -> None:
    """install + runtime + join from outside; the stand-in systemctl says the kubelet is active (0),
    inactive (3), or there is none (None)."""
    install_everything(root / "srv/store", root)
    join_root(root)
    assert (root / CONFIG).is_file()
    systemctl = root / "usr/local/bin/systemctl"
    systemctl.unlink(missing_ok=True)
    (root / LOG).unlink(missing_ok=True)
    if standin is not None:
        systemctl.write_text(STANDIN)
        systemctl.chmod(0o755)
        (root / "run/kubelet-active").write_text(standin)


def test_uninstall_stops_an_active_kubelet_before_its_files_go(host: Path) -> None:
    joined(host, "0")
    check = inside(host, "uninstall", "--check")
    assert check.returncode == 0, check.stderr
    runs = [x for x in check.stdout.splitlines() if x.startswith("would run ")]
    # join's GPU health service goes first (nodeprep.health.unit), then the kubelet, then the daemons
    assert runs[:2] == ["would run systemctl stop nodeprep-health.service",
                        "would run systemctl stop kubelet.service"], check.stdout
    assert "kubelet.service: stopped before its files go, only when systemd says it is active" in check.stdout
    assert not (host / LOG).exists()  # the plan asks systemd nothing
    done = inside(host, "uninstall")
    assert done.returncode == 0, done.stderr
    calls = (host / LOG).read_text().splitlines()
    assert calls[:4] == ["is-active --quiet nodeprep-health.service (present)",
                         "stop nodeprep-health.service (present)",
                         "is-active --quiet kubelet.service (present)",
                         "stop kubelet.service (present)"], calls
    assert "try-restart containerd.service (gone)" in calls
    assert not (host / CONFIG).exists() and not (host / "etc/kubernetes/bootstrap-kubelet.conf").exists()


def test_an_inactive_kubelet_is_not_stopped(host: Path) -> None:
    joined(host, "3")
    done = inside(host, "uninstall")
    assert done.returncode == 0, done.stderr
    calls = (host / LOG).read_text().splitlines()
    assert calls[:2] == ["is-active --quiet nodeprep-health.service (present)",
                         "is-active --quiet kubelet.service (present)"], calls
    assert not [c for c in calls if c.startswith("stop ")], calls
    assert not (host / CONFIG).exists()


def test_without_systemctl_uninstall_says_so_and_goes_on(host: Path) -> None:
    joined(host, None)
    done = inside(host, "uninstall", "--json")
    assert done.returncode == 0, done.stderr
    assert "systemctl not found: `systemctl stop kubelet.service` skipped" in json.loads(done.stdout)["notes"]
    assert not (host / CONFIG).exists() and not (host / "etc/kubernetes/bootstrap-kubelet.conf").exists()
