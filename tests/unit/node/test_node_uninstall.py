"""`nodeprep uninstall` through the real CLI on a test root: a tree snapshot (paths, modes, link
targets, content hashes) before `install --activate` + `runtime` equals the one after `uninstall`;
`--check` changes nothing and lists every path; a file nodeprep did not write is left and named; a
run killed at any step is finished by the next one; another run's lock refuses it.

Artifacts are real (tests/support/standin.py); ldconfig and depmod run for real under the root.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nodeprep import runner
from nodeprep.node.driverplan import plan_uninstall
from nodeprep.node.layout import Layout
from nodeprep.node.lock import locked
from tests.support.clirunner import invoke
from tests.support.fixtures import NVIDIA_SMI
from tests.support.standin import KERNEL, standin_store
from tests.support.tree import snapshot as tree_snapshot
from tests.unit.join.conftest import node_python

REPO = Path(__file__).resolve().parents[3]
VERSION = "535.309.01"
OPLOG = "var/log/nodeprep.log"  # the one file uninstall leaves: the node operation log (docs/node.md)
CONTAINERD = 'version = 2\n\n[plugins."io.containerd.grpc.v1.cri".containerd]\n  snapshotter = "overlayfs"\n'


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("uninstall")
    return standin_store(work, work / "store", VERSION)


def snapshot(root: Path, *, times: bool = False) -> dict[str, tuple[object, ...]]:
    return tree_snapshot(root, skip=(OPLOG,), times=times)


def debian_root(root: Path, *, containerd: bool = True) -> Path:
    """A node as nodeprep finds it: the distribution's folders and files, containerd configured
    (unless not `containerd`), the node profile, ld cache and module index made by the real tools."""
    for d in ("etc/systemd/system/multi-user.target.wants", "etc/kernel/postinst.d", "etc/kernel/postrm.d",
              "usr/bin", "usr/lib/x86_64-linux-gnu", f"lib/modules/{KERNEL}/kernel", "lib/firmware",
              "var/log", "var/lib", "var/cache", "opt"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "etc/ld.so.conf.d").mkdir()
    (root / "etc/ld.so.conf.d/libc.conf").write_text("/usr/local/lib\n")
    (root / "etc/modprobe.d").mkdir()
    (root / "etc/modprobe.d/blacklist.conf").write_text("blacklist evbug\n")
    if containerd:
        (root / "etc/containerd").mkdir()
        (root / "etc/containerd/config.toml").write_text(CONTAINERD)
        (root / "etc/containerd/config.toml").chmod(0o600)
    (root / "etc/nodeprep").mkdir()
    (root / "etc/nodeprep/node.yaml").write_text(yaml.safe_dump({"driver": {"version": VERSION}}))
    node_python(root)  # the node's /usr/bin/python3, which runs nodeprep's hook program
    runner.run(["ldconfig", "-r", root], timeout=60)
    runner.run(["depmod", "-b", root, KERNEL], timeout=60)
    return root


def install_everything(store: Path, root: Path) -> None:
    r = invoke("install", "--store", str(store), "--driver", VERSION, "--kernel", KERNEL, "--activate",
               "--root", str(root), "--node-store", "https://drivers.example/nvidia")  # what the node reaches
    assert r.exit_code == 0, r.output
    r = invoke("runtime", "--root", str(root), "--nvidia-smi-xml",
               str(NVIDIA_SMI / "dual-rtx-a5000_590.44.01.xml"))
    assert r.exit_code == 0, r.output
    for written in ("etc/cdi/nvidia.yaml", "etc/containerd/conf.d/99-nodeprep-nvidia.toml",
                    "usr/bin/nvidia-smi", "etc/kernel/postinst.d/nodeprep", "opt/nvidia/current"):
        assert os.path.lexists(root / written), written


def test_uninstall_returns_the_root_to_before_install(store: Path, tmp_path: Path) -> None:
    root = debian_root(tmp_path / "root")
    before = snapshot(root)
    install_everything(store, root)
    installed = snapshot(root)

    check = invoke("uninstall", "--check", "--json", "--root", str(root))
    assert check.exit_code == 0, check.output
    plan = json.loads(check.stdout)
    assert snapshot(root) == installed  # --check changes nothing
    # every path nodeprep added is listed (itself, or a version root or cache above it), and
    # nothing that was there before
    added = {"/" + p for p in set(installed) - set(before)}
    listed = set(plan["remove"])
    assert {p for p in added if not any(p == r or p.startswith(r + "/") for r in listed)} == set()
    assert not {p for p in plan["remove"] if p.lstrip("/") in before}
    assert plan["restore"] == ["/etc/containerd/config.toml"]
    assert ["ldconfig"] in plan["commands"] and ["depmod", KERNEL] in plan["commands"]

    r = invoke("uninstall", "--root", str(root))
    assert r.exit_code == 0, r.output
    assert snapshot(root) == before
    assert (root / "etc/containerd/config.toml").read_text() == CONTAINERD
    assert "uninstall" in (root / OPLOG).read_text()

    again = invoke("uninstall", "--root", str(root), "--json")
    assert again.exit_code == 0 and json.loads(again.stdout)["changed"] is False
    assert snapshot(root) == before


def test_a_containerd_config_nodeprep_made_from_nothing_goes(store: Path, tmp_path: Path) -> None:
    root = debian_root(tmp_path / "root", containerd=False)
    before = snapshot(root)
    install_everything(store, root)
    assert (root / "etc/containerd/config.toml").is_file()
    plan = json.loads(invoke("uninstall", "--check", "--json", "--root", str(root)).stdout)
    assert {"/etc/containerd/config.toml", "/etc/containerd"} <= set(plan["remove"])
    r = invoke("uninstall", "--root", str(root))
    assert r.exit_code == 0, r.output
    assert snapshot(root) == before


def test_a_file_nodeprep_did_not_write_is_left_and_named(store: Path, tmp_path: Path) -> None:
    root = debian_root(tmp_path / "root")
    install_everything(store, root)
    spec = root / "etc/cdi/nvidia.yaml"
    spec.write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n")  # the admin's own spec now
    (root / "etc/ld.so.conf.d/00-nvidia.conf").write_text("/opt/other/lib\n")
    check = invoke("uninstall", "--check", "--root", str(root))
    assert "would leave /etc/cdi/nvidia.yaml: not written by nodeprep" in check.stdout
    r = invoke("uninstall", "--root", str(root))
    assert r.exit_code == 0, r.output
    assert spec.read_text().startswith("cdiVersion")
    assert (root / "etc/ld.so.conf.d/00-nvidia.conf").read_text() == "/opt/other/lib\n"
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert any("/etc/cdi/nvidia.yaml" in w for w in warnings)
    assert any("/etc/ld.so.conf.d/00-nvidia.conf" in w for w in warnings)
    assert not (root / "opt/nvidia").exists() and not (root / "usr/bin/nvidia-smi").exists()


def test_another_run_holding_the_lock_refuses_it(store: Path, tmp_path: Path) -> None:
    root = debian_root(tmp_path / "root")
    install_everything(store, root)
    installed = snapshot(root)
    with locked(Layout(root)):
        r = invoke("uninstall", "--root", str(root))
    assert r.exit_code != 0
    error = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "another nodeprep run" in error[0]
    installed.pop("var/lib/nodeprep/lock")
    now = snapshot(root)
    now.pop("var/lib/nodeprep/lock")
    assert now == installed


CRASH_POINTS = [
    "uninstall:locked",
    "uninstall:restored /etc/containerd/config.toml",
    "uninstall:removed /etc/cdi/nvidia.yaml",
    "uninstall:removed /usr/bin/nvidia-smi",
    f"uninstall:removed /lib/modules/{KERNEL}/updates/nodeprep/nvidia.ko",
    "uninstall:removed /opt/nvidia/current",
    "uninstall:renamed",
    f"uninstall:removed /opt/nvidia/{VERSION}",
    "uninstall:removed /var/lib/nodeprep/state.json",
    "uninstall:ldconfig",
]


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_run_killed_at_a_step_is_finished_by_the_next(store: Path, tmp_path: Path, point: str) -> None:
    root = debian_root(tmp_path / "root")
    before = snapshot(root)
    install_everything(store, root)
    plan = json.loads(invoke("uninstall", "--check", "--json", "--root", str(root)).stdout)
    assert point.split(" ", 1)[-1] in [*plan["remove"], *plan["restore"]] or " " not in point
    killed = subprocess.run([sys.executable, "-m", "nodeprep.cli", "uninstall", "--root", str(root)],
                            env={**os.environ, "NODEPREP_CRASH_AT": point}, capture_output=True,
                            text=True, timeout=120, cwd=REPO)
    assert killed.returncode == -9, killed.stderr
    r = invoke("uninstall", "--root", str(root))
    assert r.exit_code == 0, r.output
    assert snapshot(root) == before


def test_a_root_without_nodeprep_is_left_as_it_is(tmp_path: Path) -> None:
    """Nothing to do: no change reported, and not even the lock's folders stay behind."""
    root = tmp_path / "root"
    root.mkdir()
    check = invoke("uninstall", "--check", "--root", str(root))
    assert check.exit_code == 0 and check.stdout == "nothing to do\n"
    r = invoke("uninstall", "--root", str(root), "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["changed"] is False
    assert list(root.iterdir()) == []


JOIN_TOKEN = "abcdef.0123456789abcdef"
CA_PIN = "sha256:" + "0f3bda1bf4b1b4a7c3e0b9a1c5d5e3f8f1a2b3c4d5e6f708192a3b4c5d6e7f80"
WANTS = "etc/systemd/system/multi-user.target.wants/kubelet.service"


@pytest.mark.parametrize("mode", ["kubeadm", "kubelet"])
def test_uninstall_also_undoes_the_join(store: Path, tmp_path: Path, mode: str) -> None:
    """install + join (kubeadm's JoinConfiguration and kubelet patch, or the kubelet's bootstrap
    kubeconfig, KubeletConfiguration and drop-in, with the node's labels and taints, and kubelet
    enabled by join's `systemctl enable`) + uninstall: the root is byte for byte as it was, the
    operator's profile, token and CA certificate included."""
    root = joinable_root(tmp_path / "root", mode)
    before = snapshot(root)
    install_everything(store, root)
    join_root(root)
    kubeadm = {"etc/nodeprep/kubeadm-join.yaml",
               "etc/nodeprep/kubeadm-patches/kubeletconfiguration+merge.yaml"}
    kubelet = {"etc/kubernetes/bootstrap-kubelet.conf", "var/lib/kubelet/config.yaml",
               "etc/systemd/system/kubelet.service.d/10-nodeprep.conf", WANTS}
    written = kubeadm if mode == "kubeadm" else kubelet
    assert written <= set(snapshot(root))

    plan = json.loads(invoke("uninstall", "--check", "--json", "--root", str(root)).stdout)
    assert {"/" + p for p in written} <= set(plan["remove"])
    r = invoke("uninstall", "--root", str(root))
    assert r.exit_code == 0, r.output
    assert snapshot(root) == before


def test_uninstall_keeps_kubelet_enabled_when_it_was_before_the_join(store: Path, tmp_path: Path) -> None:
    """kubelet enabled before a kubelet-mode join (its link there): uninstall leaves it enabled, and a
    second join (whose `systemctl enable` finds join's own state) does not change that."""
    root = joinable_root(tmp_path / "root", "kubelet")
    runner.run(["systemctl", f"--root={root}", "enable", "kubelet.service"], timeout=60)
    assert (root / WANTS).is_symlink()
    before = snapshot(root)
    install_everything(store, root)
    join_root(root)
    join_root(root)
    r = invoke("uninstall", "--root", str(root))
    assert r.exit_code == 0, r.output
    assert snapshot(root) == before and (root / WANTS).is_symlink()


@pytest.mark.parametrize("record", ["garbage", "link"])
def test_a_kubelet_enable_record_that_is_not_joins_undoes_nothing(store: Path, tmp_path: Path,
                                                                  record: str) -> None:
    """The record under the root is input: one that is not JSON join wrote, or a link, is left and
    named, and the kubelet links stay (nothing is removed on its word)."""
    root = joinable_root(tmp_path / "root", "kubelet")
    install_everything(store, root)
    join_root(root)
    path = root / "var/lib/nodeprep/kubelet-enable.json"
    path.unlink()
    if record == "link":
        path.symlink_to("/etc/passwd")
    else:
        path.write_text('{"format": 1, "unit": "kubelet.service", "links_before": []}\n')
    r = invoke("uninstall", "--root", str(root))
    assert r.exit_code == 0, r.output
    kept = "/var/lib/nodeprep/kubelet-enable.json: not a record nodeprep join wrote; left in place"
    assert kept in r.output
    assert (root / WANTS).is_symlink() and path.is_symlink() == (record == "link")


def join_root(root: Path) -> None:
    r = invoke("join", "--root", str(root), "--skip-discovery", "--skip-preflight", "--nvidia-smi-xml",
               str(NVIDIA_SMI / "dual-rtx-a5000_590.44.01.xml"))
    assert r.exit_code == 0, r.output


def joinable_root(root: Path, mode: str) -> Path:
    """debian_root with a cluster in the profile, its token and CA certificate, and the kubelet
    package's unit (kubelet mode enables it)."""
    root = debian_root(root)
    cluster = {"api_server": "10.0.0.10:6443", "mode": mode, "kubernetes_version": "1.30",
               "ca_cert_hashes": [CA_PIN], "taints": ["example.com/gpu=true:NoSchedule"]}
    (root / "etc/nodeprep/node.yaml").write_text(yaml.safe_dump(
        {"driver": {"version": VERSION}, "labels": {"extra": {"example.com/team": "ml"}},
         "cluster": cluster}))
    (root / "etc/nodeprep/bootstrap-token").write_text(JOIN_TOKEN + "\n")
    (root / "etc/nodeprep/bootstrap-token").chmod(0o600)
    (root / "etc/kubernetes/pki").mkdir(parents=True)
    (root / "etc/kubernetes/pki/ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (root / "lib/systemd/system").mkdir(parents=True)
    (root / "lib/systemd/system/kubelet.service").write_text("[Service]\nExecStart=/usr/bin/kubelet\n"
                                                            "[Install]\nWantedBy=multi-user.target\n")
    return root


STOP_UNDER_ROOT = "kubelet.service: not stopped: with --root, uninstall never touches the running system"
HEALTH_UNDER_ROOT = STOP_UNDER_ROOT.replace("kubelet.service", "nodeprep-health.service")
PERSISTENCED_UNDER_ROOT = ("nodeprep-persistenced.service: not stopped: with --root, uninstall never touches "
                           "the running system")
FABRICMANAGER_UNDER_ROOT = ("nodeprep-fabricmanager.service: not stopped: with --root, uninstall never "
                            "touches the running system")


@pytest.mark.parametrize("mode", ["kubeadm", "kubelet"])
def test_uninstall_under_a_root_says_it_leaves_the_running_kubelet(store: Path, tmp_path: Path,
                                                                   mode: str) -> None:
    """Join set the kubelet up: under --root the plan says the running kubelet is not stopped, and
    runs no systemctl; without join's files there is nothing to say."""
    root = joinable_root(tmp_path / "root", mode)
    install_everything(store, root)
    check = invoke("uninstall", "--check", "--root", str(root))
    assert check.exit_code == 0 and STOP_UNDER_ROOT not in check.stdout, check.output
    join_root(root)
    check = invoke("uninstall", "--check", "--root", str(root))
    assert check.exit_code == 0, check.output
    assert STOP_UNDER_ROOT in check.stdout.splitlines() and "systemctl" not in check.stdout
    plan = json.loads(invoke("uninstall", "--check", "--json", "--root", str(root)).stdout)
    # join's GPU health service (nodeprep.health.unit) is stopped before its unit goes, then the kubelet,
    # then the activation's daemons
    assert plan["notes"] == [HEALTH_UNDER_ROOT, STOP_UNDER_ROOT, FABRICMANAGER_UNDER_ROOT,
                             PERSISTENCED_UNDER_ROOT]
    assert not [c for c in plan["commands"] if c[0] == "systemctl"]
    assert {"/etc/systemd/system/nodeprep-health.service",
            "/etc/systemd/system/kubelet.service.d/20-nodeprep-health.conf"} <= set(plan["remove"])


def test_the_live_plan_stops_kubelet_before_anything_else() -> None:
    """On the running system the plan's first command stops the kubelet (only when active, it says);
    under another root it has no such command."""
    plan = plan_uninstall(["/var/lib/kubelet/config.yaml"], ["/etc/containerd/config.toml"], [],
                          loaded=("nvidia",), kernels=(KERNEL,), restart=("containerd.service",),
                          ldconfig=True, unit="/etc/systemd/system/nodeprep-nvidia.service",
                          stop=("kubelet.service",))
    assert plan.commands(live=True)[0] == ["systemctl", "stop", "kubelet.service"]
    assert plan.commands(live=True)[-1] == ["systemctl", "try-restart", "containerd.service"]
    assert plan.notes(live=True) == ["kubelet.service: stopped before its files go, only when systemd "
                                     "says it is active"]
    assert ["systemctl", "stop", "kubelet.service"] not in plan.commands(live=False)
    assert plan.notes(live=False) == [STOP_UNDER_ROOT]


@pytest.mark.parametrize("mode", ["kubeadm", "kubelet"])
def test_join_files_from_before_the_header_are_named_once_with_how_to_remove_them(
        store: Path, tmp_path: Path, mode: str) -> None:
    """A join before 2026-11-26 wrote its files without nodeprep's header: uninstall cannot know them
    as its own, so it leaves them (nothing destroyed) and names each in one line with the path, that
    the header is missing, and the command that removes it (a file at a path only the other cluster
    mode writes, such as kubeadm's KubeletConfiguration, is named as any file nodeprep did not write)."""
    root = joinable_root(tmp_path / "root", mode)
    install_everything(store, root)
    join_root(root)
    kubeadm = ["etc/nodeprep/kubeadm-join.yaml",
               "etc/nodeprep/kubeadm-patches/kubeletconfiguration+merge.yaml"]
    kubelet = ["etc/kubernetes/bootstrap-kubelet.conf", "var/lib/kubelet/config.yaml",
               "etc/systemd/system/kubelet.service.d/10-nodeprep.conf"]
    files = kubeadm if mode == "kubeadm" else kubelet
    old = {}
    for rel in files:  # as the older join wrote them
        lines = (root / rel).read_text().splitlines(keepends=True)
        assert lines[0].startswith("# Written by nodeprep"), rel
        old[rel] = "".join(lines[1:])
        (root / rel).write_text(old[rel])
    if mode == "kubeadm":  # kubeadm's own KubeletConfiguration, at a path of the other mode: not join's
        (root / "var/lib/kubelet").mkdir(parents=True)
        (root / "var/lib/kubelet/config.yaml").write_text("kind: KubeletConfiguration\n")
    r = invoke("uninstall", "--root", str(root))
    assert r.exit_code == 0, r.output
    if mode == "kubeadm":
        assert "warning: /var/lib/kubelet/config.yaml: not written by nodeprep; left in place" in r.output
    for rel in files:
        named = [x for x in r.output.splitlines() if f"/{rel}" in x]
        line = (f"warning: /{rel}: no '# Written by nodeprep' header, so not known as nodeprep's and left in "
                f"place; if an older nodeprep join wrote it, remove it by hand: rm /{rel}")
        assert named == [line], r.output
        assert (root / rel).read_text() == old[rel]
    assert not (root / "opt/nvidia").exists()  # the rest went


def test_the_persistenced_unit_moves_with_activation_and_goes_with_uninstall(store: Path,
                                                                             tmp_path: Path) -> None:
    """Activation writes nodeprep-persistenced.service and its wants link; uninstall removes both and,
    on the running system, stops the daemon before the modules are unloaded (here under --root: the
    plan says it is not stopped)."""
    root = debian_root(tmp_path / "root")
    install_everything(store, root)
    unit = root / "etc/systemd/system/nodeprep-persistenced.service"
    wants = root / "etc/systemd/system/multi-user.target.wants/nodeprep-persistenced.service"
    assert "ExecStart=/opt/nvidia/current/bin/nvidia-persistenced" in unit.read_text()
    assert os.readlink(wants) == "../nodeprep-persistenced.service"
    plan = json.loads(invoke("uninstall", "--check", "--json", "--root", str(root)).stdout)
    assert {"/etc/systemd/system/nodeprep-persistenced.service",
            "/etc/systemd/system/multi-user.target.wants/nodeprep-persistenced.service"} <= {*plan["remove"]}
    assert PERSISTENCED_UNDER_ROOT in plan["notes"]
    live = plan_uninstall(["/etc/systemd/system/nodeprep-persistenced.service"], [], [], loaded=("nvidia",),
                          kernels=(), restart=(), ldconfig=False,
                          unit="/etc/systemd/system/nodeprep-nvidia.service",
                          stop=("nodeprep-persistenced.service",),
                          units=("/etc/systemd/system/nodeprep-persistenced.service",))
    assert live.commands(live=True)[:2] == [["systemctl", "stop", "nodeprep-persistenced.service"],
                                            ["modprobe", "-r", "nvidia"]]
    assert ["systemctl", "daemon-reload"] in live.commands(live=True)
    r = invoke("uninstall", "--root", str(root))
    assert r.exit_code == 0, r.output
    assert not os.path.lexists(unit) and not os.path.lexists(wants)
