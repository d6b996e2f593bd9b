"""`--check` on the commands that write to the Kubernetes API (`labels --apply`, `verify-gpus
--apply`, `verify-nodes`) and to a file (`labels --out`): each prints its plan, read from the Node
and the file as they are, and changes nothing: the loopback API stand-in sees no PATCH (its request
log is what a server would see) and the directory tree is byte for byte, mode for mode, what it was."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from nodeprep.cli import main
from nodeprep.labels.core import VERIFIED_LABEL
from tests.unit.node.test_selftest import T4
from tests.unit.node.test_selftest import node as selftest_node

from .conftest import Recorded, Server, write_dmi

NODE = "gpu-1"
BOOT = "3f1b8a52-0c6e-4f0e-9d2b-6a4d2e9a7b11"


def snapshot(top: Path) -> dict[str, tuple[int, bytes | str]]:
    """Every path under `top`: (mode, bytes or link text or 'dir')."""
    out: dict[str, tuple[int, bytes | str]] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for n in dirnames + filenames:
            p = Path(dirpath, n)
            st = p.lstat()
            what: bytes | str = os.readlink(p) if p.is_symlink() else "dir" if p.is_dir() else p.read_bytes()
            out[str(p.relative_to(top))] = (st.st_mode, what)
    return out


def node_object(labels: dict[str, str], taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": NODE, "resourceVersion": "7", "labels": labels},
            "spec": {"taints": taints or []}, "status": {"nodeInfo": {"bootID": BOOT}}}


def apiserver(labels: dict[str, str]) -> Callable[[Server, Recorded], tuple[int, dict[str, str], str]]:
    """GET the one Node or the list; PATCH would succeed (so that a write would show in the log)."""
    def handle(srv: Server, req: Recorded) -> tuple[int, dict[str, str], str]:
        json_type = {"Content-Type": "application/json"}
        if req.method == "GET" and req.path == "/api/v1/nodes":
            return 200, json_type, json.dumps({"kind": "NodeList", "items": [node_object(labels)]})
        if req.path != f"/api/v1/nodes/{NODE}":
            return 404, json_type, json.dumps({"kind": "Status", "message": "not found"})
        return 200, json_type, json.dumps(node_object(labels))

    return handle


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": server}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t0ken"}}],
    }))
    return path


def run(args: list[str]) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, args, catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def test_labels_check_plans_the_file_and_the_patch_and_writes_neither(
    http_server: Callable[..., Server], empty_sysfs: Path, empty_root: Path, tmp_path: Path,
    nvidia_smi_fixtures: Path,
) -> None:
    srv = http_server(apiserver({"nodeprep.dev/gone": "x"}))
    kc = kubeconfig(tmp_path / "kubeconfig", srv.url)
    dmi = write_dmi(tmp_path / "dmi", sys_vendor="Amazon EC2", product_name="g4dn.xlarge")
    out = tmp_path / "labels.json"
    out.write_text("{}\n")
    args = ["labels", "--root", str(empty_root), "--sysfs-root", str(empty_sysfs), "--dmi-root", str(dmi),
            "--nvidia-smi-xml", str(nvidia_smi_fixtures / "tesla-t4_515.105.01.xml"), "--cloud", "none",
            "--out", str(out)]
    api = ["--apply", "--kubeconfig", str(kc), "--node", NODE]
    before = snapshot(tmp_path)
    code, stdout, err = run([*args, *api, "--check"])
    assert code == 0, err
    assert snapshot(tmp_path) == before
    assert [r.method for r in srv.requests] == ["GET"]
    lines = stdout.splitlines()
    assert lines[0].startswith(f"would write {out} (") and lines[0].endswith(" bytes)")
    assert f"node {NODE}: would set nvidia.com/gpu.product=Tesla-T4" in lines
    assert f"node {NODE}: would remove nodeprep.dev/gone" in lines  # nodeprep's, no longer produced
    # the real run writes what the check said, and a second check finds the file as it would write it
    assert run([*args, *api])[0] == 0 and [r.method for r in srv.requests][-1] == "PATCH"
    assert run(args)[0] == 0  # the file alone (the --apply run's file also holds the patch sent)
    assert run([*args, "--check"])[1] == f"{out}: unchanged\n"


def test_verify_gpus_check_prints_the_verdict_it_would_publish(
    http_server: Callable[..., Server], tmp_path: Path
) -> None:
    srv = http_server(apiserver({"nodeprep.dev/driver-version": "515.105.01"}))
    root, sysfs = selftest_node(tmp_path, "515.105.01", "515.105.01", ["0000:00:1e.0"])
    (root / "proc/sys/kernel/random").mkdir(parents=True)
    (root / "proc/sys/kernel/random/boot_id").write_text(BOOT + "\n")
    kc = kubeconfig(tmp_path / "kubeconfig", srv.url)
    args = ["verify-gpus", "--root", str(root), "--sysfs-root", str(sysfs), "--nvidia-smi-xml", str(T4),
            "--apply", "--kubeconfig", str(kc), "--node", NODE]
    before = snapshot(tmp_path)
    code, stdout, err = run([*args, "--check", "--json"])
    assert code == 0, err
    assert snapshot(tmp_path) == before and [r.method for r in srv.requests] == ["GET"]
    planned = json.loads(stdout)["would_publish"]
    assert planned["node"] == NODE and planned["passed"] is True and planned["label"] != "failed"
    assert f"node {NODE}: would set {VERIFIED_LABEL}={planned['label']}" in err
    run(args)  # the real run publishes the same verdict
    patch = json.loads(srv.requests[-1].body)
    assert srv.requests[-1].method == "PATCH"
    assert patch["metadata"]["labels"][VERIFIED_LABEL] == planned["label"]


def test_verify_nodes_check_lists_the_taints_it_would_change(
    http_server: Callable[..., Server], tmp_path: Path
) -> None:
    srv = http_server(apiserver({"nodeprep.dev/driver-version": "515.105.01"}))
    kc = kubeconfig(tmp_path / "kubeconfig", srv.url)
    code, stdout, err = run(["verify-nodes", "--kubeconfig", str(kc), "--check"])
    assert code == 0, err
    assert stdout.splitlines() == [
        f"node {NODE}: no valid GPU verdict (no verdict): taint added (--check: not patched)"]
    assert [r.method for r in srv.requests] == ["GET"]
