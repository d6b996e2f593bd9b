"""The node-side modules run for real through Ansible (ad-hoc, connection local, the library from
this checkout, a temporary directory as the node's root), in ansible-core's integration sequence:
check -> changed, apply -> changed, re-apply -> unchanged, check -> unchanged; bad input fails
with one line naming the field and leaves the node as it was."""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from nodeprep import runner
from tests.support.fixtures import NVIDIA_SMI
from tests.support.standin import KERNEL, standin_store, tree
from tests.unit.node.test_node_uninstall import snapshot

from .conftest import REPO

CAPTURE = NVIDIA_SMI / "a100-sxm4-80gb-mig_535.54.03.xml"


def module(
    name: str,
    args: dict[str, object],
    *,
    check: bool = False,
    common: bool = True,
    env: dict[str, str] | None = None,
) -> tuple[str, dict[str, object]]:
    """Run nodeprep.fleet.<name> on localhost; (status word, result). `common`: add nodeprep_path."""
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
        json.dumps({"nodeprep_path": str(REPO), **args} if common else args),
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
        env={"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1", **(env or {})},
    )
    line = next(x for x in r.stdout.splitlines() if x.startswith("localhost |"))
    status, _, payload = line[len("localhost | ") :].partition(" => ")
    return status.strip(), json.loads(payload)


PROFILE = {
    "driver": {"version": "535.309.01", "store": "https://store.example.invalid/nvidia"},
    "labels": {"cloud": "none", "extra": {"example.com/pool": "a"}},
}


def driver_args(tmp_path: Path, version: str) -> tuple[Path, dict[str, str]]:
    """An empty root (tmp_path/root) and nodeprep_driver's arguments to install `version` there from a
    store of small real artifacts (tmp_path/store)."""
    store = standin_store(tmp_path / "work", tmp_path / "store", version)
    root = tmp_path / "root"
    root.mkdir()
    return root, {"root": str(root), "version": version, "store": str(store), "kernel": KERNEL}


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



def test_profile_module_writes_with_the_one_writer(tmp_path: Path) -> None:
    """A FIFO planted where the profile goes is replaced, not waited on (the module's old read
    blocked on it); the file gets its mode exactly, whatever was there, and no temporary stays."""
    import os
    import stat

    target = tmp_path / "etc/nodeprep/node.yaml"
    target.parent.mkdir(parents=True)
    os.mkfifo(target)
    status, result = module("nodeprep_profile", {"root": str(tmp_path), "content": PROFILE})
    assert status == "CHANGED", result
    assert target.is_file() and yaml.safe_load(target.read_text()) == PROFILE
    assert stat.S_IMODE(target.stat().st_mode) == 0o644 and os.listdir(target.parent) == ["node.yaml"]
    target.chmod(0o666)  # the right bytes, too wide a mode: rewritten
    assert module("nodeprep_profile", {"root": str(tmp_path), "content": PROFILE})[0] == "CHANGED"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644 and os.listdir(target.parent) == ["node.yaml"]


def test_profile_without_ca_pins_needs_the_join_opt_out(tmp_path: Path) -> None:
    """A kubeadm profile without CA pins is refused, naming the field, unless the task carries the
    join's opt-out (the role variable of kube_join_insecure_skip_ca_verification): then
    nodeprep_profile writes it, the install role's probe sees it current and nodeprep_runtime reads it."""
    unpinned = {**PROFILE, "cluster": {"mode": "kubeadm", "api_server": "10.0.0.10:6443",
                                       "token_file": "/etc/nodeprep/bootstrap-token"}}
    args = {"root": str(tmp_path), "content": unpinned}
    status, result = module("nodeprep_profile", args)
    assert status == "FAILED!" and "cluster.ca_cert_hashes" in str(result["msg"]) and result["exit_code"] == 2
    assert not (tmp_path / "etc/nodeprep/node.yaml").exists()
    optout = {"insecure_skip_ca_verification": True}
    status, result = module("nodeprep_profile", {**args, **optout})
    assert status == "CHANGED", result
    assert yaml.safe_load((tmp_path / "etc/nodeprep/node.yaml").read_text()) == unpinned
    probe = {"root": str(tmp_path), "profile": unpinned}
    assert module("nodeprep_info", probe)[1]["profile_current"] is False
    assert module("nodeprep_info", {**probe, **optout})[1]["profile_current"] is True
    runtime = {"root": str(tmp_path), "nvidia_smi_xml": str(CAPTURE)}
    status, result = module("nodeprep_runtime", runtime, check=True)
    assert status == "FAILED!" and "cluster.ca_cert_hashes" in str(result["msg"]), result
    status, result = module("nodeprep_runtime", {**runtime, **optout}, check=True)
    assert status == "CHANGED" and result["files"], result

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


H200_FACTS = {"nodeprep": "gpu-facts", "source": "nvidia-smi", "gpus": [  # the capture's one GPU
    {"brand": "nvidia", "arch": "9.0", "name": "NVIDIA H200", "pci_device": "10de:2335"}]}


def test_labels_module_records_the_gpu_facts(tmp_path: Path) -> None:
    """nodeprep_labels records the CUDA gate's GPU facts as `nodeprep labels` does (one library call,
    nodeprep.node.labeling.label_node, which records them): beneath the root, on a root with the
    driver nodeprep_driver activated, from the real H200 capture; check mode reports the file and
    leaves the root as it was; a root without an active driver gets none; the CLI writes the same
    bytes."""
    from nodeprep.cli import main
    from nodeprep.containerhooks.gate import read_facts
    from tests.support.clirunner import separate_stderr
    from tests.support.fixtures import GPU_MACHINE

    version = "535.309.01"
    root, driver = driver_args(tmp_path, version)
    assert module("nodeprep_driver", driver)[0] == "CHANGED"
    facts = root / "opt/nvidia/gpu-facts.json"
    assert not facts.exists()  # no /sys in this root: the activation had no GPU to record
    capture = GPU_MACHINE / "h200_580.159.04.xml"
    args = {"root": str(root), "cloud": "none", "nvidia_smi_xml": str(capture), "kernel": KERNEL,
            "nfd_file": "", "json_file": ""}
    before = tree(root)
    status, result = module("nodeprep_labels", args, check=True)
    assert status == "CHANGED" and result["gpu_facts"] == str(facts), result
    assert tree(root) == before
    status, result = module("nodeprep_labels", args)
    assert status == "CHANGED" and result["gpu_facts"] == str(facts), result
    assert json.loads(facts.read_text()) == H200_FACTS
    assert oct(facts.stat().st_mode & 0o7777) == oct(0o644) and not facts.is_symlink()
    assert read_facts(str(facts)) == [{"brand": "nvidia", "arch": "9.0"}]  # what the gate sees
    assert module("nodeprep_labels", args)[0] == "SUCCESS"
    assert module("nodeprep_labels", args, check=True)[0] == "SUCCESS"
    facts.chmod(0o600)  # the right bytes, a mode the gate's user may not read: check says so, run fixes it
    before = tree(root)
    assert module("nodeprep_labels", args, check=True)[0] == "CHANGED"
    assert tree(root) == before and facts.stat().st_mode & 0o7777 == 0o600
    assert module("nodeprep_labels", args)[0] == "CHANGED" and facts.stat().st_mode & 0o7777 == 0o644
    outside = tmp_path / "outside.json"
    outside.write_text("host file\n")
    facts.unlink()
    facts.symlink_to(outside)  # an image's link at the facts path: replaced, never written through
    assert module("nodeprep_labels", args)[0] == "CHANGED"
    assert outside.read_text() == "host file\n" and not facts.is_symlink()
    assert json.loads(facts.read_text()) == H200_FACTS

    written = facts.read_bytes()
    facts.unlink()
    r = separate_stderr().invoke(main, ["labels", "--root", str(root), "--nvidia-smi-xml", str(capture),
                                        "--cloud", "none"])
    assert r.exit_code == 0, r.stderr
    assert facts.read_bytes() == written  # the CLI's call and the module's are one

    bare = tmp_path / "bare"
    bare.mkdir()
    status, result = module("nodeprep_labels", {**args, "root": str(bare)})
    assert status == "SUCCESS" and result["gpu_facts"] is None, result
    assert tree(bare) == {}


def test_driver_module_names_the_field_not_a_flag(tmp_path: Path) -> None:
    """Ansible users have no `--store`: a library input error reaches them as its profile field."""
    root = tmp_path / "root"
    root.mkdir()
    status, result = module("nodeprep_driver", {"root": str(root), "version": "535.309.01",
                                                "store": str(tmp_path / "absent"), "kernel": KERNEL})
    assert status == "FAILED!" and result["exit_code"] == 2, result
    assert result["msg"] == f"driver.store: {tmp_path / 'absent'} is not a directory", result
    assert tree(root) == {}


def test_driver_module_sequence(tmp_path: Path) -> None:
    """nodeprep_driver on a root, from a store of small real artifacts (tests/support/standin.py):
    check mode reports the library's plan and writes nothing, the run installs and activates, a
    re-run and a check after it change nothing; the doctor's version gate is the library's."""
    version = "535.309.01"
    root, args = driver_args(tmp_path, version)
    status, result = module("nodeprep_driver", {**args, "doctor": True, "doctor_checks": ["state"]},
                            check=True)
    assert status == "CHANGED" and result["active"] == version and result["previous"] is None, result
    assert result["preflight"] == ["state: no NVIDIA driver installed by nodeprep (nodeprep install "
                                   "--driver VERSION)"], result
    plan = result["plan"]
    assert plan["install_kmod"].startswith(f"nvidia-kmod-{version}") and plan["activation"]["switch"] is True
    assert tree(root) == {}
    status, result = module("nodeprep_driver", args)
    assert status == "CHANGED" and result["active"] == version and result["installed"] == [version], result
    assert (root / "opt/nvidia/current").readlink() == Path(version)
    assert module("nodeprep_driver", args)[0] == "SUCCESS"
    status, result = module("nodeprep_driver", args, check=True)
    assert status == "SUCCESS" and result["plan"]["changes"] is False, result
    status, result = module("nodeprep_doctor", {"root": str(root), "checks": ["state"],
                                                "expect_version": "535.216.03"})
    assert status == "FAILED!"
    assert result["msg"] == f"doctor: state: active driver is {version}, expected 535.216.03"
    status, _ = module("nodeprep_doctor", {"root": str(root), "checks": ["state"], "expect_version": version})
    assert status == "SUCCESS"


def test_driver_module_follows_the_gpus(tmp_path: Path) -> None:
    """nodeprep_driver with gpus (the profile's driver.gpus, `install --gpus`): `node` reads the H200
    (10de:2335) under the root, branch_policy oldest takes 550.163.01, the oldest version in the store
    whose supported-GPU list names it (535.309.01's does not), in check mode and for real; a branch
    none of whose versions runs the GPU fails naming the GPU and the branch, and writes nothing."""
    import gzip

    from tests.support.standin import gpu_list_store
    from tests.unit.node.test_branch import DATA
    from tests.unit.node.test_node_support import sysfs

    lists = {v: gzip.decompress((DATA / f"{v}.json.gz").read_bytes()) for v in ("535.309.01", "550.163.01")}
    store = gpu_list_store(tmp_path / "work", tmp_path / "store", lists)
    root = sysfs(tmp_path / "root", "2335:10de:16c3")
    before = tree(root)
    args = {"root": str(root), "store": str(store), "kernel": KERNEL, "gpus": "node",
            "branch_policy": "oldest"}
    status, result = module("nodeprep_driver", args, check=True)
    assert status == "CHANGED" and result["version"] == "550.163.01", result
    assert tree(root) == before
    status, result = module("nodeprep_driver", {**args, "branch": "535"})
    assert status == "FAILED!" and result["exit_code"] == 2, result
    assert str(result["msg"]).startswith(
        "driver.branch: no driver version of branch 535 supports every GPU of the node "
        "(10de:2335:10de:16c3); tried 535.309.01 (oldest first): "), result
    assert tree(root) == before
    status, result = module("nodeprep_driver", args)
    assert status == "CHANGED" and result["version"] == "550.163.01" and result["installed"] == ["550.163.01"]
    assert (root / "opt/nvidia/current").readlink() == Path("550.163.01")
    assert module("nodeprep_driver", {**args, "branch": "550"})[0] == "SUCCESS"


def test_driver_module_state_absent_uninstalls(tmp_path: Path) -> None:
    """state=absent is `nodeprep uninstall`: check mode lists what goes and removes nothing, the run
    removes it, a re-run changes nothing; version and store are not needed."""
    version = "535.309.01"
    root, args = driver_args(tmp_path, version)
    assert module("nodeprep_driver", args)[0] == "CHANGED"
    installed = tree(root)
    absent = {"root": str(root), "state": "absent"}
    status, result = module("nodeprep_driver", absent, check=True)
    assert status == "CHANGED" and "/opt/nvidia/current" in result["removed"], result
    assert f"/opt/nvidia/{version}" in result["plan"]["remove"]
    assert tree(root) == installed
    status, result = module("nodeprep_driver", absent)
    assert status == "CHANGED" and result["kept"] == [], result
    for gone in ("opt/nvidia", "var/lib/nodeprep", "etc/kernel/postinst.d/nodeprep", "usr/bin/nvidia-smi",
                 "etc/ld.so.conf.d/00-nvidia.conf", "etc/systemd/system/nodeprep-nvidia.service"):
        assert not (root / gone).exists(), gone
    assert module("nodeprep_driver", absent)[0] == "SUCCESS"
    status, result = module("nodeprep_driver", {"root": str(root), "state": "active"})
    assert status == "FAILED!" and "any of the following are missing: version, branch, gpus" in result["msg"]
    status, result = module("nodeprep_driver", {"root": str(root), "state": "active", "branch": "550"})
    assert status == "FAILED!" and result["msg"].endswith("missing: store"), result


def containerd_root(tmp_path: Path) -> tuple[Path, Path, str]:
    """A root with an installed driver and containerd's own main file: (root, that file, its text)."""
    from tests.unit.join.conftest import install_driver

    root = tmp_path / "root"
    root.mkdir()
    install_driver(root, tmp_path / "work")
    main = root / "etc/containerd/config.toml"
    main.parent.mkdir(parents=True)
    original = 'version = 2\n\n[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "pause:3.9"\n'
    main.write_text(original)
    return root, main, original


def test_runtime_module_state_absent_undoes_the_runtime(tmp_path: Path) -> None:
    """nodeprep_runtime state=absent: the drop-in and CDI spec nodeprep wrote go, with the folders
    runtime made for them, and the containerd main file is byte for byte what it was (the root as
    before); check mode first changes nothing; a re-run is unchanged."""
    root, main, original = containerd_root(tmp_path)
    profile = root / "etc/nodeprep/node.yaml"
    profile.parent.mkdir(parents=True)
    profile.write_text(yaml.safe_dump(PROFILE))
    before = snapshot(root)
    args = {"root": str(root), "nvidia_smi_xml": str(CAPTURE)}
    assert module("nodeprep_runtime", args)[0] == "CHANGED"
    written = tree(root)
    assert main.read_text() != original and "etc/cdi/nvidia.yaml" in written
    status, result = module("nodeprep_runtime", {"root": str(root), "state": "absent"}, check=True)
    assert status == "CHANGED" and result["restored"] == ["/etc/containerd/config.toml"], result
    assert sorted(result["removed"]) == ["/etc/cdi", "/etc/cdi/nvidia.yaml", "/etc/containerd/conf.d",
                                         "/etc/containerd/conf.d/99-nodeprep-nvidia.toml",
                                         "/etc/nvidia-container-runtime",
                                         "/etc/nvidia-container-runtime/config.toml",
                                         "/usr/libexec", "/usr/libexec/nodeprep",
                                         "/usr/libexec/nodeprep/cdi-hook",
                                         "/usr/libexec/nodeprep/cdi-hook.modules",
                                         "/usr/share", "/usr/share/containers", "/usr/share/containers/oci",
                                         "/usr/share/containers/oci/hooks.d",
                                         "/usr/share/containers/oci/hooks.d/99-nodeprep-cuda-gate.json"]
    assert tree(root) == written
    status, result = module("nodeprep_runtime", {"root": str(root), "state": "absent"})
    assert status == "CHANGED" and result["kept"] == [], result
    assert main.read_text() == original and snapshot(root) == before  # the folders runtime made gone too
    assert module("nodeprep_runtime", {"root": str(root), "state": "absent"})[0] == "SUCCESS"


@pytest.mark.parametrize("mode", ["kubeadm", "kubelet"])
def test_join_module_state_absent_undoes_the_join(tmp_path: Path, mode: str) -> None:
    """nodeprep_join state=absent undoes the join as `nodeprep uninstall` does (the same
    nodeprep.join.removal plan): check mode lists what would go and changes nothing; the run leaves the
    root as it was before the join, folders and modes included (the containerd main file written back,
    the kubelet enablement join's `systemctl enable` made taken back, the folders join made and left
    empty removed; profile, token and CA certificate kept); a re-run is unchanged."""
    root, main, original = containerd_root(tmp_path)
    (root / "etc/systemd/system/multi-user.target.wants").mkdir(parents=True)
    (root / "var/lib").mkdir(parents=True)  # the distribution's folders: never removed
    (root / "lib/systemd/system").mkdir(parents=True)  # the kubelet package's unit
    (root / "lib/systemd/system/kubelet.service").write_text("[Service]\nExecStart=/usr/bin/kubelet\n"
                                                            "[Install]\nWantedBy=multi-user.target\n")
    (root / "etc/kubernetes/pki").mkdir(parents=True)
    (root / "etc/kubernetes/pki/ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    cluster = {"api_server": "10.231.0.1:6443", "ca_cert_hashes": ["sha256:" + "5f" * 32],
               "kubernetes_version": "1.31", "node_name": "node1", "mode": mode}
    profile = {"root": str(root), "content": {**PROFILE, "cluster": cluster}}
    assert module("nodeprep_profile", profile)[0] == "CHANGED"
    (root / "etc/nodeprep/bootstrap-token").write_text("abcdef.0123456789abcdef\n")
    (root / "etc/nodeprep/bootstrap-token").chmod(0o600)

    before = snapshot(root)  # folders and modes too: join's empty folders go as uninstall's do
    join = {"root": str(root), "nvidia_smi_xml": str(CAPTURE), "skip_discovery": True, "skip_preflight": True}
    status, result = module("nodeprep_join", join)
    assert status == "CHANGED", result
    joined = snapshot(root)
    wants = "etc/systemd/system/multi-user.target.wants/kubelet.service"
    ours = ({"etc/nodeprep/kubeadm-join.yaml"} if mode == "kubeadm"
            else {"etc/kubernetes/bootstrap-kubelet.conf", "var/lib/kubelet/config.yaml", wants})
    assert ours <= set(joined) and main.read_text() != original

    absent = {"root": str(root), "state": "absent"}
    status, result = module("nodeprep_join", absent, check=True)
    assert status == "CHANGED" and result["restored"] == ["/etc/containerd/config.toml"], result
    folders = ({"/var/lib/kubelet", "/etc/systemd/system/kubelet.service.d"} if mode == "kubelet"
               else {"/etc/nodeprep/kubeadm-patches"})  # folders join made (/etc/kubernetes was there)
    assert {"/" + p for p in ours} | {"/etc/cdi/nvidia.yaml", *folders} <= set(result["removed"]), result
    assert snapshot(root) == joined
    status, result = module("nodeprep_join", absent)
    assert status == "CHANGED" and result["kept"] == [], result
    assert snapshot(root) == before and main.read_text() == original
    assert module("nodeprep_join", absent)[0] == "SUCCESS"


def test_join_module_state_absent_killed_after_the_files_is_finished_by_the_next_run(tmp_path: Path) -> None:
    """A state=absent run killed once join's files are gone, before their folders: the next run
    removes the folders it had noted (uninstall's journal), and the root is as before the join."""
    root, main, original = containerd_root(tmp_path)
    (root / "var/lib").mkdir(parents=True)
    (root / "etc/systemd/system/multi-user.target.wants").mkdir(parents=True)
    (root / "lib/systemd/system").mkdir(parents=True)
    (root / "lib/systemd/system/kubelet.service").write_text("[Service]\nExecStart=/usr/bin/kubelet\n"
                                                            "[Install]\nWantedBy=multi-user.target\n")
    (root / "etc/kubernetes/pki").mkdir(parents=True)
    (root / "etc/kubernetes/pki/ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    cluster = {"api_server": "10.231.0.1:6443", "ca_cert_hashes": ["sha256:" + "5f" * 32],
               "kubernetes_version": "1.31", "node_name": "node1", "mode": "kubelet"}
    profile = {"root": str(root), "content": {**PROFILE, "cluster": cluster}}
    assert module("nodeprep_profile", profile)[0] == "CHANGED"
    (root / "etc/nodeprep/bootstrap-token").write_text("abcdef.0123456789abcdef\n")
    (root / "etc/nodeprep/bootstrap-token").chmod(0o600)
    before = snapshot(root)
    join = {"root": str(root), "nvidia_smi_xml": str(CAPTURE), "skip_discovery": True, "skip_preflight": True}
    assert module("nodeprep_join", join)[0] == "CHANGED"
    absent = {"root": str(root), "state": "absent"}
    status, result = module("nodeprep_join", absent, env={"NODEPREP_CRASH_AT": "removal:files"})
    assert status == "FAILED!", result
    assert not (root / "var/lib/kubelet/config.yaml").exists() and (root / "var/lib/kubelet").is_dir()
    status, result = module("nodeprep_join", absent)
    assert status == "CHANGED" and "/var/lib/kubelet" in result["removed"], result
    assert snapshot(root) == before and main.read_text() == original


def test_doctor_module_fails_with_the_problems(tmp_path: Path) -> None:
    """The gate fails on its problems; in check mode it reports them (ok false, `preflight`) and the
    play goes on, like the driver module's check with `doctor`."""
    status, result = module("nodeprep_doctor", {"root": str(tmp_path), "checks": ["state"]})
    assert status == "FAILED!" and str(result["msg"]).startswith("doctor: state:")
    assert result["changed"] is False
    status, result = module("nodeprep_doctor", {"root": str(tmp_path), "checks": ["state"]}, check=True)
    assert status == "SUCCESS" and result["ok"] is False and result["preflight"][0].startswith("state: ")


def test_info_probe_reports_current_only_for_this_install(tmp_path: Path) -> None:
    """The nodeprep_install probe: `current` only when the zipapp, the tree unpacked from it and the
    wrapper match the sha256 and the library imports; `profile_current` only for the written profile."""
    import hashlib

    app = tmp_path / "node/usr/local/lib/nodeprep/nodeprep.pyz"
    app.parent.mkdir(parents=True)
    with zipfile.ZipFile(app, "w") as zf:  # a real zipapp of this checkout's package, as the role builds it
        for path in sorted((REPO / "nodeprep").rglob("*.py")):
            zf.write(path, path.relative_to(REPO).as_posix())
    app.chmod(0o755)
    digest = hashlib.sha256(app.read_bytes()).hexdigest()
    lib, wrapper = app.parent / "lib", tmp_path / "node/usr/local/bin/nodeprep"
    unpack = {"src": str(app), "dest": str(lib), "wrapper": str(wrapper), "interpreter": sys.executable}
    probe = {
        "nodeprep_path": str(lib),
        "root": str(tmp_path / "node"),
        "sha256": digest,
        "zipapp": str(app),
        "wrapper": str(wrapper),
        "interpreter": sys.executable,
        "profile": PROFILE,
    }
    status, result = module("nodeprep_info", probe)
    assert status == "FAILED!" and result["current"] is False and result["installed_sha256"] is None
    assert module("nodeprep_unpack", unpack, common=False)[0] == "CHANGED"
    status, result = module("nodeprep_info", probe)
    assert status == "SUCCESS" and result["changed"] is False
    assert result["current"] is True and result["installed_sha256"] == digest
    assert result["profile_current"] is False  # no profile written yet
    assert module("nodeprep_profile", {"root": probe["root"], "content": PROFILE})[0] == "CHANGED"
    assert module("nodeprep_info", probe)[1]["profile_current"] is True
    other = {**PROFILE, "labels": {"cloud": "none", "extra": {"example.com/pool": "b"}}}
    assert module("nodeprep_info", {**probe, "profile": other})[1]["profile_current"] is False
    assert module("nodeprep_info", {**probe, "sha256": "0" * 64})[1]["current"] is False
    wrapper.write_text(wrapper.read_text() + "# edited\n")
    assert module("nodeprep_info", probe)[1]["current"] is False
    assert module("nodeprep_unpack", unpack, common=False)[0] == "CHANGED"  # the role then rewrites it
    app.chmod(0o644)
    assert module("nodeprep_info", probe)[1]["current"] is False


def test_info_probe_finds_a_missing_dependency(tmp_path: Path) -> None:
    """The probe only looks dependencies up (no import), yet a dependency that is not installed
    makes it fail and name it, like the full check does. The package is hidden from the module's
    interpreter by a sitecustomize that blocks its import (sys.modules entry None)."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['tomli_w'] = None\n")
    env = {"PYTHONPATH": str(hide)}
    probe = {"sha256": "0" * 64}
    status, result = module("nodeprep_info", probe, env=env)
    assert status == "FAILED!" and result["missing"] == ["tomli_w"] and result["current"] is False
    status, result = module("nodeprep_info", {}, env=env)  # the full import check
    assert status == "FAILED!" and result["missing"] == ["tomli_w"]
    status, result = module("nodeprep_info", {})
    assert status == "SUCCESS" and set(result["dependencies"]) == {
        "click", "yaml", "jinja2", "requests", "zstandard", "jsonschema", "tomli_w"
    }
    assert all(v and v != "?" for v in result["dependencies"].values())
    assert "dependencies" not in module("nodeprep_info", probe)[1]


def test_join_module_writes_the_token_it_is_given(tmp_path: Path) -> None:
    """nodeprep_join with `token` writes the token file (0600) before it plans, in the same call;
    check mode writes nothing and plans with the token it would write; a malformed token is refused
    before anything is written; the token never shows in the result. No driver is installed in this
    root, so the plan itself then fails for that (the full join with a token runs in
    tests/slow/fleet/test_site.py)."""
    token = "abcdef.0123456789abcdef"
    profile = {
        **PROFILE,
        "cluster": {
            "api_server": "10.231.0.1:6443",
            "ca_cert_hashes": ["sha256:" + "5f" * 32],
            "kubernetes_version": "1.31",
            "node_name": "node1",
        },
    }
    assert module("nodeprep_profile", {"root": str(tmp_path), "content": profile})[0] == "CHANGED"
    args = {"root": str(tmp_path), "token": token, "dry_run": True, "nvidia_smi_xml": str(CAPTURE)}
    token_file = tmp_path / "etc/nodeprep/bootstrap-token"
    # check mode plans with the token it would write (no file yet) and shows the whole plan on a
    # node without a driver or GPU: what stops the real run is reported, not a failure
    status, result = module("nodeprep_join", args, check=True)
    assert status == "CHANGED", result
    found = result["preflight"]
    assert any(f.startswith("CDI spec: /opt/nvidia/current does not exist") for f in found), found
    assert any(f.startswith("CUDA gate: /usr/bin/python3 under") for f in found), found  # no python3 here
    assert any("no NVIDIA GPU on this node" in f for f in found), found
    assert "/etc/nodeprep/kubeadm-join.yaml" in [f["path"] for f in result["plan"]["files"]]
    assert not token_file.exists() and token not in json.dumps(result)
    status, result = module("nodeprep_runtime", {"root": str(tmp_path), "nvidia_smi_xml": str(CAPTURE)},
                            check=True)
    assert status == "CHANGED" and any(f.startswith("CDI spec: ") for f in result["preflight"]), result
    # a malformed token fails first, names the option, and is written nowhere
    for check in (True, False):
        bad = "abcdef.0123456789ABCDEF"
        status, result = module("nodeprep_join", {**args, "token": bad}, check=check)
        assert status == "FAILED!" and result["exit_code"] == 2, result
        assert str(result["msg"]).startswith("token: not a bootstrap token")
        assert not token_file.exists() and bad not in json.dumps(result)
    status, result = module("nodeprep_join", args)
    assert status == "FAILED!" and result["error_type"] == "StateError", result  # no driver here
    assert token not in json.dumps(result)
    assert token_file.read_text() == token + "\n" and token_file.stat().st_mode & 0o777 == 0o600
    token_file.chmod(0o644)
    module("nodeprep_join", args)
    assert token_file.stat().st_mode & 0o777 == 0o600


def test_zipapp_action_builds_on_the_controller(tmp_path: Path) -> None:
    """nodeprep_zipapp is an action plugin (run here through ad-hoc Ansible for real): check mode
    reports the sha256 it would write and writes nothing; a run writes the zipapp (0755, that
    sha256) atomically; a re-run is unchanged; a bad src fails with one line naming it and leaves
    dest alone."""
    import hashlib

    dest = tmp_path / "controller/nodeprep.pyz"
    args = {"src": str(REPO), "dest": str(dest)}
    status, result = module("nodeprep_zipapp", args, check=True, common=False)
    assert status == "CHANGED" and not dest.exists()
    want = result["sha256"]
    status, result = module("nodeprep_zipapp", args, common=False)
    assert status == "CHANGED" and result["sha256"] == want and result["dest"] == str(dest)
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == want
    assert dest.stat().st_mode & 0o777 == 0o755
    assert [p.name for p in dest.parent.iterdir()] == ["nodeprep.pyz"]  # no temporary left
    assert module("nodeprep_zipapp", args, common=False)[0] == "SUCCESS"
    assert module("nodeprep_zipapp", args, check=True, common=False)[0] == "SUCCESS"
    status, result = module("nodeprep_zipapp", {**args, "src": str(tmp_path)}, common=False)
    assert status == "FAILED!" and result["msg"] == (
        f"src: {tmp_path} has no nodeprep/__init__.py (expected a nodeprep source checkout)"
    )
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == want
