"""`nodeprep bootstrap` as a command: exit codes, journal lines, --json, resume, against a temporary
root. The full bring-up with real artifacts is in tests/slow/bootstrap/."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import yaml

from nodeprep.cli import main
from nodeprep.containerhooks import gate
from tests.support.clirunner import separate_stderr
from tests.support.fixtures import GPU_MACHINE, NVIDIA_SMI
from tests.support.standin import KERNEL, standin_image_root, tree
from tests.unit.join.conftest import node_python

CAPTURE = NVIDIA_SMI / "dual-rtx-a5000_590.44.01.xml"


def invoke(*args: str) -> tuple[int, str, str]:
    r = separate_stderr().invoke(main, ["bootstrap", *args])
    return r.exit_code, r.stdout, r.stderr


def profile(tmp_path: Path, store: Path) -> Path:
    p = tmp_path / "node.yaml"
    p.write_text(f'driver:\n  version: "535.309.01"\n  store: {store}\n  kernel: 6.1.0-28-amd64\n'
                 "labels:\n  cloud: none\n")
    return p


def test_bad_profile_exit_2_and_nothing_written(tmp_path: Path) -> None:
    bad = tmp_path / "node.yaml"
    bad.write_text('driver:\n  version: "535.309.01"\n  flavour: closed\n')
    root = tmp_path / "root"
    root.mkdir()
    code, out, err = invoke("--root", str(root), "--profile", str(bad))
    assert code == 2 and out == ""
    assert err.startswith("error: ") and "driver.flavour" in err and "Traceback" not in err
    assert list(root.iterdir()) == []


def test_missing_default_profile(tmp_path: Path) -> None:
    code, _, err = invoke("--root", str(tmp_path))
    assert code == 2
    assert err.strip() == f"error: {tmp_path}/etc/nodeprep/node.yaml: no profile (pass --profile FILE)"


def test_bad_store_fails_the_first_step_and_resumes(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    store = tmp_path / "store"  # not there yet (e.g. not mounted)
    p = profile(tmp_path, store)
    code, out, err = invoke("--root", str(root), "--profile", str(p), "--json")
    assert code == 2, err
    data = json.loads(out)
    assert data["ok"] is False and data["exit_code"] == 2
    assert [(s["name"], s["status"]) for s in data["steps"]] == [
        ("driver", "failed"), ("modules", "pending"), ("mig", "pending"), ("labels", "pending"),
        ("runtime", "pending"), ("join", "pending")]
    assert data["steps"][0]["error"] == f"driver.store: {store} is not a directory"  # a field, no flag
    state = json.loads((root / "var/lib/nodeprep/bootstrap.json").read_text())
    assert state["runs"][data["profile_digest"]]["steps"]["driver"]["status"] == "failed"

    # journal mode: one line per step, then the summary
    code, out, err = invoke("--root", str(root), "--profile", str(p))
    assert code == 2 and out == ""
    lines = [ln for ln in err.splitlines() if ln.startswith("bootstrap: ")]
    assert lines[0].startswith("bootstrap: driver: failed in ") and lines[0].endswith(
        f": driver.store: {store} is not a directory")
    assert lines[1:6] == [f"bootstrap: {n}: not run (an earlier step failed)"
                          for n in ("modules", "mig", "labels", "runtime", "join")]
    assert lines[6].startswith("bootstrap: FAILED (rerun to resume) in ")
    assert "1 failed, 5 pending" in lines[6]


def test_help_lists_the_steps() -> None:
    code, out, _ = invoke("--help")
    assert code == 0
    for word in ("driver", "labels", "join", "--root", "--json", "--check", "--restart"):
        assert word in out
    assert "--dry-run-join" not in out  # deprecated: still accepted, with one warning line


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def image_root(tmp_path: Path) -> tuple[Path, Path]:
    """An image root with one kernel and a token file, and a profile that joins a cluster whose API
    server is a closed loopback port (never any other address), from a store of small real artifacts."""
    store, root = standin_image_root(tmp_path)
    token = root / "etc/nodeprep/bootstrap-token"
    token.write_text("abcdef.0123456789abcdef\n")
    token.chmod(0o600)
    p = tmp_path / "node.yaml"
    p.write_text(yaml.safe_dump({
        "driver": {"version": "535.309.01", "store": str(store), "kernel": KERNEL},
        "labels": {"cloud": "none"},
        "cluster": {"api_server": f"127.0.0.1:{_closed_port()}", "ca_cert_hashes": ["sha256:" + "0f" * 32],
                    "kubernetes_version": "1.31", "kubelet_extra_args": {"max-pods": "110"}},
    }))
    return root, p


def test_dry_run_join_prints_its_warnings_and_a_rerun_joins(tmp_path: Path) -> None:
    """The warnings of the runtime and join steps (kubeadm to run on the booted node, a moved
    max-pods, no container toolkit) are printed once each, not only recorded in bootstrap.json; a
    dry-run join is not recorded as done: the next bootstrap runs the join (here it fails: nothing
    listens at the loopback API server), it does not say `join: already done`."""
    root, p = image_root(tmp_path)
    args = ("--root", str(root), "--profile", str(p), "--nvidia-smi-xml", str(CAPTURE))
    code, _, err = invoke(*args, "--dry-run-join")
    assert code == 0, err
    assert [ln for ln in err.splitlines() if "deprecated" in ln and "--check" in ln] == [
        "warning: --dry-run-join is deprecated; --check shows the plan and changes nothing (this run "
        "installs and writes as before, only the join command is not run)"]
    warnings = [ln for ln in err.splitlines() if ln.startswith("warning: ")]
    assert "warning: moved deprecated kubelet flags into KubeletConfiguration: max-pods" in warnings
    assert any(w.startswith("warning: nvidia-container-runtime is not installed") for w in warnings)
    assert any("not running kubeadm join; run `kubeadm join --config" in w for w in warnings)
    assert len(warnings) == len(set(warnings))
    assert "bootstrap: join: done in " in err and "the next bootstrap joins" in err
    logged = [ln.split("]: ", 1)[1] for ln in (root / "var/log/nodeprep.log").read_text().splitlines()]
    assert [ln.split(":")[0] for ln in logged] == ["driver", "modules", "mig", "labels", "runtime", "join"]
    assert logged[0] == f"driver: 535.309.01 active for kernel {KERNEL}"
    code, _, err = invoke(*args)
    assert "bootstrap: join: already done" not in err
    assert "bootstrap: driver: already done" in err
    assert "bootstrap: join: failed in " in err and "cluster.api_server: " in err and code == 1


def test_labels_step_records_the_gpu_facts(tmp_path: Path) -> None:
    """The labels step records the CUDA gate's GPU facts as `nodeprep labels` does (one library call,
    nodeprep.node.labeling.label_node, which records them), beneath --root, from the real H200
    capture (the image has no /sys: the activation alone records nothing); --check says it would and
    changes nothing, before the driver is there and after."""
    root, p = image_root(tmp_path)
    data = yaml.safe_load(p.read_text())
    del data["cluster"]  # the bring-up up to the runtime; joining is not what this is about
    p.write_text(yaml.safe_dump(data))
    h200 = GPU_MACHINE / "h200_580.159.04.xml"
    args = ("--root", str(root), "--profile", str(p), "--nvidia-smi-xml", str(h200))
    facts = root / "opt/nvidia/gpu-facts.json"

    def labels_step(*extra: str) -> dict[str, Any]:
        code, out, err = invoke(*args, "--json", *extra)
        assert code == 0, err
        return next(s for s in json.loads(out)["steps"] if s["name"] == "labels")["result"]

    before = tree(root)
    planned = labels_step("--check")  # no driver yet: the driver step would activate one
    assert "/opt/nvidia/gpu-facts.json" in planned["files"]
    assert planned["summary"].endswith("; would write /opt/nvidia/gpu-facts.json)"), planned
    assert tree(root) == before and not (root / "opt").exists()

    done = labels_step()
    assert done["summary"] == (f"{len(done['labels'])} labels (gpu facts: nvidia-smi; wrote "
                               "/opt/nvidia/gpu-facts.json)")
    assert json.loads(facts.read_text()) == {"nodeprep": "gpu-facts", "source": "nvidia-smi", "gpus": [
        {"brand": "nvidia", "arch": "9.0", "name": "NVIDIA H200", "pci_device": "10de:2335"}]}
    assert facts.stat().st_mode & 0o7777 == 0o644 and not facts.is_symlink()
    assert gate.read_facts(str(facts)) == [{"brand": "nvidia", "arch": "9.0"}]  # what the gate sees

    assert labels_step("--check")["summary"].endswith("(gpu facts: nvidia-smi)")  # recorded: nothing to do
    facts.write_text('{"nodeprep": "gpu-facts", "source": "pci", "gpus": []}\n')  # stale facts
    before = tree(root)
    planned = labels_step("--check")
    assert planned["summary"].endswith("; would write /opt/nvidia/gpu-facts.json)"), planned
    assert tree(root) == before


def test_check_shows_the_whole_plan_and_changes_nothing(tmp_path: Path) -> None:
    """`bootstrap --check` on an image without a driver (and this machine without a GPU): every step
    shows its plan, what would stop the real run is printed once as a `preflight` warning, exit 0,
    and nothing under the root changes (no bootstrap.json, no lock, no log, no driver)."""
    root, p = image_root(tmp_path)
    before = sorted((str(x.relative_to(root)), x.is_dir()) for x in root.rglob("*"))
    args = ("--root", str(root), "--profile", str(p), "--nvidia-smi-xml", str(CAPTURE), "--check")
    code, _, err = invoke(*args)
    assert code == 0, err
    journal = [ln for ln in err.splitlines() if ln.startswith("bootstrap: ")]
    assert journal[0].startswith("bootstrap: driver: done in ") and journal[0].endswith(
        f"(would install 535.309.01 for kernel {KERNEL} and activate it)")
    assert "doctor now: 2 finding(s)" in journal[1]
    assert journal[2].endswith("(no mig.config in the profile: MIG left as it is)")
    assert "would write /etc/containerd/config.toml" in journal[4]
    assert "would run kubeadm join --config /etc/nodeprep/kubeadm-join.yaml" in journal[5]
    assert journal[6].startswith("bootstrap: check: plan shown, nothing changed in ")
    found = [ln for ln in err.splitlines() if ln.startswith("warning: preflight: ")]
    assert found == [
        "warning: preflight: doctor: state: no NVIDIA driver installed by nodeprep (nodeprep install "
        "--driver VERSION) (on the node as it is now)",
        "warning: preflight: doctor: ldcache: no active driver root for the ld cache to resolve into "
        "(on the node as it is now)",
        "warning: preflight: CDI spec: /opt/nvidia/current does not exist: no active driver (on the "
        "node as it is now)"]
    assert "warning: moved deprecated kubelet flags into KubeletConfiguration: max-pods" in err
    code, out, _ = invoke(*args, "--json")
    data = json.loads(out)
    assert code == 0 and data["check"] is True and data["steps"][5]["result"]["written"] == []
    assert sorted((str(x.relative_to(root)), x.is_dir()) for x in root.rglob("*")) == before


def test_the_driver_follows_the_gpus_of_the_profile(tmp_path: Path) -> None:
    """driver.gpus: node (the H200 10de:2335 under the image's sys/) with driver.branch_policy: oldest
    installs and activates 550.163.01, the oldest version in the store whose list names the H200 (535's
    does not); a profile that pins branch 535 fails the driver step naming the GPU and the branch, and
    installs nothing. The same fields `install` takes (nodeprep.node.branch.pick)."""
    import gzip

    from tests.support.standin import gpu_list_store
    from tests.unit.node.test_branch import DATA
    from tests.unit.node.test_node_support import sysfs

    lists = {v: gzip.decompress((DATA / f"{v}.json.gz").read_bytes()) for v in ("535.309.01", "550.163.01")}
    store = gpu_list_store(tmp_path / "work", tmp_path / "store", lists)
    root = sysfs(tmp_path / "root", "2335:10de:16c3")
    (root / "lib/modules" / KERNEL).mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    node_python(root)
    pinned = tmp_path / "pinned.yaml"
    pinned.write_text(yaml.safe_dump({"driver": {"store": str(store), "gpus": "node", "branch": "535"},
                                      "labels": {"cloud": "none"}}))
    code, out, err = invoke("--root", str(root), "--profile", str(pinned), "--json")
    assert code == 2, err
    step = json.loads(out)["steps"][0]
    assert (step["name"], step["status"]) == ("driver", "failed")
    assert step["error"].startswith("driver.branch: no driver version of branch 535 supports every GPU of "
                                    "the node (10de:2335:10de:16c3); tried 535.309.01 (newest first): ")
    assert not (root / "opt").exists()
    follow = tmp_path / "node.yaml"
    driver = {"store": str(store), "gpus": "node", "branch_policy": "oldest"}
    follow.write_text(yaml.safe_dump({"driver": driver, "labels": {"cloud": "none"}}))
    code, out, err = invoke("--root", str(root), "--profile", str(follow), "--nvidia-smi-xml", str(CAPTURE),
                            "--json")
    step = json.loads(out)["steps"][0]
    assert (step["name"], step["status"]) == ("driver", "done"), err
    assert step["result"]["summary"] == f"550.163.01 active for kernel {KERNEL}"
    assert (root / "opt/nvidia/current").readlink() == Path("550.163.01")
    assert not (root / "opt/nvidia/535.309.01").exists()


def test_the_driver_step_reads_the_gpus_where_sysfs_root_says(tmp_path: Path) -> None:
    """An image root has no GPU of its own: with --sysfs-root naming a capture of the node's /sys (an
    H200), `driver.gpus: node` chooses from that capture, as the labels step reads it."""
    import gzip

    from tests.support.standin import gpu_list_store
    from tests.unit.node.test_branch import DATA
    from tests.unit.node.test_node_support import sysfs

    lists = {v: gzip.decompress((DATA / f"{v}.json.gz").read_bytes()) for v in ("535.309.01", "550.163.01")}
    store = gpu_list_store(tmp_path / "work", tmp_path / "store", lists)
    capture = sysfs(tmp_path / "capture", "2335:10de:16c3") / "sys"
    root = tmp_path / "root"
    (root / "lib/modules" / KERNEL).mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    node_python(root)
    profile = tmp_path / "node.yaml"
    driver = {"store": str(store), "gpus": "node", "branch_policy": "oldest"}
    profile.write_text(yaml.safe_dump({"driver": driver, "labels": {"cloud": "none"}}))
    code, out, err = invoke("--root", str(root), "--profile", str(profile), "--json", "--check")
    step = json.loads(out)["steps"][0]
    assert (step["name"], step["status"]) == ("driver", "failed"), out
    assert step["error"] == f"driver.gpus: no NVIDIA GPU under {root}/sys/bus/pci/devices"
    code, out, err = invoke("--root", str(root), "--sysfs-root", str(capture), "--profile", str(profile),
                            "--json", "--check")
    step = json.loads(out)["steps"][0]
    assert (step["name"], step["status"]) == ("driver", "done"), out
    assert step["result"]["summary"].startswith("would install 550.163.01 "), step
    assert not (root / "opt").exists()
