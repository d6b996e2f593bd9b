"""An 8-GPU HGX H100 node from `nodeprep bootstrap` (issue 39, "Done when"), for real where it can be:

- the driver is the session's real build (`real_build`, Debian 12's 535 for Debian 12's kernel; its
  modules reused, no second compile) whose user space `build-driver` makes anew with
  nvidia-persistenced built from NVIDIA's source at the driver's version (NODEPREP_NVIDIA_COMPANIONS)
  and with Fabric Manager from an archive packed in its real layout around STAND-IN binaries
  (tests/support/fmarchive.py: no Fabric Manager archive is reachable here);
- the node is a real Debian 12 image root (tests/support/testhosts.py) bootstrapped with `--root`;
- the machine is an HGX H100 as two stand-ins see it: the SYSFS FIXTURE tests/support/hgxsysfs.py
  (8 GPUs, 4 NVSwitch bridges of class 0x0680, 8 ConnectX-7) and NVIDIA's NVML MOCK machine `h100`
  (tests/support/mocknvml.py; its driver version set to the build's, and the fabric "In Progress"
  variant of tests/fixtures/mocknvml) for MIG, the labels and the self-test;
- GFD v0.20.0 (NVIDIA's binary) labels the same mock machine with the same sysfs tree;
- no API server: the Node the kubelet would register is made from the join configuration written,
  and the taint's rule (nodeprep.join.verification, the same code verify-nodes runs) decides it; the
  real API server's side of that rule is tests/slow/join/test_gpu_verification.py.

Not done here, impossible without a GPU: running the units (no systemd, no nvidia.ko loaded), and
MIG instances created or destroyed (the mock answers Not Supported; the layout used is in place).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeprep import artifact
from nodeprep.builder import fabricmanager, persistenced
from nodeprep.join.verification import SELFTEST_ANNOTATION, reconcile, verdict_patch
from nodeprep.labels.core import VERIFIED_LABEL
from nodeprep.node.selftest import Verdict
from nodeprep.profile import UNVERIFIED_TAINT
from tests.slow.labels.test_labels_gfd_mocknvml import gfd_labels
from tests.support import companions, fmarchive, hgxsysfs, mocknvml, nvidia
from tests.support import rawartifact as ra
from tests.support.fixtures import REPO
from tests.support.standin import standin_kmod
from tests.support.testhosts import debian_rootfs
from tests.unit.join.conftest import build_payload

pytestmark = pytest.mark.slow

TOKEN = "abcdef.0123456789abcdef"
HASH = "sha256:" + "0f3bda1bf4b1b4a7c3e0b9a1c5d5e3f8f1a2b3c4d5e6f708192a3b4c5d6e7f80"
MIG = {"version": "v1", "mig-configs": {"all-disabled": [{"devices": "all", "mig-enabled": False}]}}
BOOT = "5b7f3c1e-2d4a-4e6b-9c8d-0a1b2c3d4e5f"
# nodeprep's own keys beside GFD's: gpu.present, and mig-manager's two (a mig.config is set)
NODEPREP_ONLY = {"nvidia.com/gpu.present", "nvidia.com/mig.config", "nvidia.com/mig.config.state"}
GFD_ONLY = {"nvidia.com/gfd.timestamp"}
MODE = "nvidia.com/gpu.mode"
OTHER_FM = "590.48.01"  # the Fabric Manager an unpinned glob put beside driver 580.126.09 (#735)


def nodeprep(*args: object, env: dict[str, str] | None = None,
             timeout: float = 900) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "NODEPREP_CRASH_AT"}
    return subprocess.run([sys.executable, "-m", "nodeprep.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO,
                          env={**(env or base), "PYTHONPATH": str(REPO)})


def mock_machine(base: Path, version: str, folder: Path, name: str) -> Path:
    """The mock's `base` profile answering driver `version` (the node's module) as `name`.yaml."""
    profile = yaml.safe_load(base.read_text())
    profile["system"]["driver_version"] = version
    profile["system"]["nvml_version"] = "12." + version
    out = folder / f"{name}.yaml"
    out.write_text(yaml.safe_dump(profile, sort_keys=False))
    return out


@pytest.fixture(scope="module")
def hgx_store(real_build, tmp_path_factory: pytest.TempPathFactory) -> Path:  # type: ignore[no-untyped-def]
    """The real build's driver with persistenced from source and the packed Fabric Manager."""
    reason = mocknvml.skip_reason() or nvidia.skip_reason()
    name = f"nvidia-persistenced-{real_build.driver_version}.tar.gz"
    if reason:
        pytest.skip(reason)
    if name not in companions.ARCHIVES:
        pytest.skip(f"no pinned persistenced source for driver {real_build.driver_version}")
    source = companions.archive(name)
    if isinstance(source, str):
        pytest.skip(source)
    work = tmp_path_factory.mktemp("hgx-build")
    fm = fmarchive.pack(work / "fm", real_build.driver_version)
    store = work / "store"
    r = nodeprep("build-driver", "--driver", real_build.driver_version, "--kernel", real_build.kernel_release,
                 "--store", store, "--cache", real_build.cache, "--no-smoke-test",
                 "--persistenced-source", source, "--persistenced-sha256", companions.ARCHIVES[name],
                 "--fabricmanager", fm, "--fabricmanager-sha256", artifact.sha256_file(fm), "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["compiled"] is False  # the shared build's modules, by their compile key
    return store


def write_profile(path: Path, version: str, flavour: str, kernel: str, store: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({
        "driver": {"version": version, "flavour": flavour, "store": str(store), "kernel": kernel,
                   "fabric_timeout": 2},
        "labels": {"cloud": "none"},
        "mig": {"config": MIG, "select": "all-disabled"},
        "cluster": {"mode": "kubeadm", "api_server": "10.0.0.10:6443",
                    "token_file": "/etc/nodeprep/bootstrap-token", "ca_cert_hashes": [HASH],
                    "kubernetes_version": "1.31", "gpu_taint": True, "node_name": "hgx-0"},
    }, sort_keys=False))
    return path


def registered_node(root: Path) -> dict[str, Any]:
    """The Node the kubelet registers from the join configuration nodeprep wrote (name, labels, taints),
    with this boot's id in its status."""
    doc = yaml.safe_load((root / "etc/nodeprep/kubeadm-join.yaml").read_text())
    reg = doc["nodeRegistration"]
    flag = next(a["value"] for a in reg["kubeletExtraArgs"] if a["name"] == "node-labels")
    labels = dict(kv.split("=", 1) for kv in flag.split(","))
    return {"metadata": {"name": reg["name"], "labels": labels, "annotations": {}},
            "spec": {"taints": reg["taints"]}, "status": {"nodeInfo": {"bootID": BOOT}}}


def self_test(root: Path, sysfs: Path, profile: Path, env: dict[str, str]) -> tuple[int, dict[str, Any]]:
    r = nodeprep("verify-gpus", "--root", root, "--sysfs-root", sysfs, "--profile", profile, "--json",
                 env=env)
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def after_verdict(node: dict[str, Any], out: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The Node after the node published `out` (verify-gpus' verdict) and verify-nodes reconciled it."""
    verdict = Verdict(out["passed"], tuple(out["problems"]), driver_version=out["driver_version"])
    patch, _ = verdict_patch(node, verdict, BOOT)
    meta = node["metadata"]
    node = {**node, "metadata": {**meta, "labels": {**meta["labels"], **patch["metadata"]["labels"]},
                                 "annotations": {**meta["annotations"], **patch["metadata"]["annotations"]}}}
    change, reason = reconcile(node)
    if change is not None:
        node = {**node, "spec": change["spec"]}
    return node, reason


def test_an_hgx_h100_node_bootstraps_to_a_verified_fabric(real_build, hgx_store: Path,  # type: ignore[no-untyped-def]
                                                         test_cache: Path, tmp_path: Path) -> None:
    v, k = real_build.driver_version, real_build.kernel_release
    root = debian_rootfs(test_cache, tmp_path / "root")
    (root / "proc/sys/kernel/random").mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/random/boot_id").write_text(BOOT + "\n")
    token = root / "etc/nodeprep/bootstrap-token"
    profile = write_profile(root / "etc/nodeprep/node.yaml", v, real_build.flavour, k, hgx_store)
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    sysfs = hgxsysfs.hgx_h100(tmp_path / "sys", driver=v)  # the module of the build is "loaded"
    mocks = tmp_path / "mock"
    mocks.mkdir()
    complete = mock_machine(mocknvml.config("h100"), v, mocks, "h100")
    in_progress = mock_machine(mocknvml.derived("h100-fabric-in-progress", mocks), v, mocks, "in-progress")
    env = mocknvml.env(test_cache, complete, {k: val for k, val in os.environ.items()
                                              if k != "NODEPREP_CRASH_AT"})

    # the ExecCondition of the Fabric Manager unit, on this machine's PCI devices
    cond = nodeprep("fabric-manager", "--condition", "--sysfs-root", sysfs)
    assert cond.returncode == 0 and "Fabric Manager needed" in cond.stdout, cond

    r = nodeprep("bootstrap", "--root", root, "--profile", profile, "--sysfs-root", sysfs, "--mig", "--nvml",
                 "--dry-run-join", env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    journal = [ln.split(":")[1].strip() for ln in r.stderr.splitlines()
               if ln.startswith("bootstrap: ") and ": done in " in ln]
    assert journal == ["driver", "modules", "mig", "labels", "runtime", "join"]

    # persistenced (from source) and Fabric Manager (the packed stand-ins) of the active version
    assert os.readlink(root / "opt/nvidia/current") == v
    vdir = root / "opt/nvidia" / v
    manifest = json.loads((vdir / "manifest.json").read_text())
    assert manifest["extra"]["persistenced"]["from"] == "source"
    assert persistenced.embedded_version((vdir / "bin/nvidia-persistenced").read_bytes()) == v
    assert manifest["extra"]["fabricmanager"]["version"] == v
    assert (vdir / "bin/nv-fabricmanager").read_bytes()[:4] == b"\x7fELF"
    units = root / "etc/systemd/system"
    assert "ExecStart=/opt/nvidia/current/bin/nvidia-persistenced --verbose" in (
        units / "nodeprep-persistenced.service").read_text()
    fm_unit = (units / "nodeprep-fabricmanager.service").read_text()
    assert "ExecCondition=nodeprep fabric-manager --condition" in fm_unit
    assert "ExecStart=/opt/nvidia/current/bin/nv-fabricmanager -c " in fm_unit
    for unit in ("nodeprep-persistenced.service", "nodeprep-fabricmanager.service"):
        assert os.readlink(units / "multi-user.target.wants" / unit) == f"../{unit}"

    # the MIG layout was in place (recorded) before the labels, the runtime and the join were written
    written = [root / p for p in ("var/lib/nodeprep/mig.json", "etc/nodeprep/labels.json",
                                  "etc/containerd/conf.d/99-nodeprep-nvidia.toml",
                                  "etc/nodeprep/kubeadm-join.yaml")]
    stamps = [p.stat().st_mtime_ns for p in written]
    assert stamps == sorted(stamps) and len(set(stamps)) == 4, list(zip(written, stamps, strict=True))
    assert json.loads(written[0].read_text())["state"] == "success"
    labels = json.loads(written[1].read_text())
    assert labels["nvidia.com/mig.config.state"] == "success"

    # the labels are GFD's on the same mock machine and the same PCI tree, gpu.clique included
    theirs = gfd_labels(nvidia.nvidia_binaries(test_cache)["gpu-feature-discovery"], complete, "none",
                        tmp_path / "gfd", sysfs)
    ours = {key: val for key, val in labels.items() if key.startswith("nvidia.com/")}
    # gpu.mode apart: GFD finds no device in the fixture's PCI tree (it says `unknown`, as on an empty
    # bus, where tests/slow/labels shows both equal), nodeprep reads the GPUs' class 0x0302 there
    assert (ours.pop(MODE), theirs.pop(MODE)) == ("compute", "unknown")
    assert {key: val for key, val in ours.items() if key not in NODEPREP_ONLY} == \
        {key: val for key, val in theirs.items() if key not in GFD_ONLY}
    assert ours["nvidia.com/gpu.clique"] and ours["nvidia.com/gpu.count"] == "8"

    # registered tainted; the self-test passes once every fabric is COMPLETED: the taint lifts
    node = registered_node(root)
    assert UNVERIFIED_TAINT.key in {t["key"] for t in node["spec"]["taints"]}
    code, out = self_test(root, sysfs, profile, env)
    assert code == 0 and out["passed"], out
    assert {g["fabric"] for g in out["gpus"]} == {"Completed"} and len(out["gpus"]) == 8
    lifted, reason = after_verdict(node, out)
    assert UNVERIFIED_TAINT.key not in {t["key"] for t in lifted["spec"]["taints"]}, reason

    # the fabric still "In Progress" after driver.fabric_timeout: it stays tainted, the state in the reason
    code, out = self_test(root, sysfs, profile, mocknvml.env(test_cache, in_progress, env))
    assert code == 1 and not out["passed"]
    assert {g["fabric"] for g in out["gpus"]} == {"In Progress"}
    held, reason = after_verdict(node, out)
    assert UNVERIFIED_TAINT.key in {t["key"] for t in held["spec"]["taints"]}
    assert held["metadata"]["labels"][VERIFIED_LABEL] == "failed"
    note = json.loads(held["metadata"]["annotations"][SELFTEST_ANNOTATION])
    assert "fabric: GPU 0000:1a:00.0 fabric state In Progress (Fabric Manager has not registered it; " \
        "CUDA fails with error 802 until it has)" in note["problems"]


def test_a_fabric_manager_of_another_version_is_refused_before_anything_switches(  # type: ignore[no-untyped-def]
        real_build, hgx_store: Path, test_cache: Path, tmp_path: Path) -> None:
    """After the HGX node is up, a profile names a driver whose user space carries Fabric Manager
    590.48.01 (a stand-in driver: stand-in libraries and module, tests/support/standin.py, around the
    packed archive of 590.48.01, as an unpinned glob ships it): one error line, exit 2, the active
    version and its units unchanged."""
    v, k = real_build.driver_version, real_build.kernel_release
    root = debian_rootfs(test_cache, tmp_path / "root")
    sysfs = hgxsysfs.hgx_h100(tmp_path / "sys", driver=v)
    env = mocknvml.env(test_cache, mock_machine(mocknvml.config("h100"), v, tmp_path, "h100"),
                       {key: val for key, val in os.environ.items() if key != "NODEPREP_CRASH_AT"})
    good = write_profile(root / "etc/nodeprep/node.yaml", v, real_build.flavour, k, hgx_store)
    r = nodeprep("bootstrap", "--root", root, "--profile", good, "--sysfs-root", sysfs, "--mig", "--nvml",
                 "--dry-run-join", env=env)
    assert r.returncode == 2 and "bootstrap-token" in r.stderr  # no token: up to the join
    assert os.readlink(root / "opt/nvidia/current") == v

    other = "535.309.99"
    bad = tmp_path / "bad-store"
    bad.mkdir()
    payload = build_payload(tmp_path / "us", other)
    archive = fmarchive.pack(tmp_path / "fm", OTHER_FM)
    fm = fabricmanager.read_archive(archive, artifact.sha256_file(archive), OTHER_FM, "amd64")
    fabricmanager.place(fm, payload, {})
    manifest = artifact.Manifest(kind="userspace", driver_version=other, arch="amd64", os="debian-12",
                                 input_digest="0" * 64, inputs={archive.name: artifact.sha256_file(archive)},
                                 extra={"fabricmanager": fm.record()})
    us, _ = artifact.pack(payload, manifest, bad)
    ra.store_with(bad, [(us, artifact.read_manifest(us)), standin_kmod(tmp_path / "ko", other, bad, k)])
    units = root / "etc/systemd/system"
    before = {p.name: p.read_bytes() for p in units.glob("nodeprep-*.service")}
    profile = write_profile(tmp_path / "other.yaml", other, "proprietary", k, bad)
    r = nodeprep("bootstrap", "--root", root, "--profile", profile, "--sysfs-root", sysfs, "--mig", "--nvml",
                 "--dry-run-join", env=env)
    assert r.returncode == 2, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, r.stderr
    assert f"its Fabric Manager is {OTHER_FM}, the driver is {other}" in errors[0]
    assert os.readlink(root / "opt/nvidia/current") == v
    assert not os.path.lexists(root / "opt/nvidia" / other)
    assert {p.name: p.read_bytes() for p in units.glob("nodeprep-*.service")} == before
