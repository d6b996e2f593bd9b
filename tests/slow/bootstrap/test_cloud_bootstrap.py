"""From user-data to a prepared node, for real: `nodeprep cloud-init` renders the user-data for a
profile; cloud-init's own code (tests/slow/bootstrap/ci_apply.py, run by the distribution's python3)
merges it and writes its files into a Debian 12 rootfs (mmdebstrap, tests/support/testhosts.py);
the first runcmd entry, the nodeprep installer, runs in a chroot of that rootfs and installs the
wheel downloaded from the store over loopback HTTP with its sha256 checked; the second runcmd entry,
`nodeprep bootstrap --profile /etc/nodeprep/node.yaml`, runs as the same command with `--root`
(a chroot would load modules into this machine's kernel) and with the join in dry-run.

Stand-ins, each at one boundary: the GPU is the recorded `nvidia-smi -q -x` of a Tesla T4
(tests/fixtures/nvidia-smi), the artifact store is a loopback HTTP server this test starts, and there is
no API server (dry-run join). The artifacts are the session's real driver build (`real_build`).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from nodeprep import __version__, cloudinit, runner
from nodeprep.errors import CommandError
from nodeprep.labels.output import parse_nfd
from tests.support.fixtures import NVIDIA_SMI
from tests.support.httpdir import serve_directory as store_server  # also bench/bootstrap.py's
from tests.support.testhosts import debian_rootfs

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
FIXTURE = NVIDIA_SMI / "tesla-t4_515.105.01.xml"
TOKEN = "abcdef.0123456789abcdef"
HASH = "sha256:" + "0f3bda1bf4b1b4a7c3e0b9a1c5d5e3f8f1a2b3c4d5e6f708192a3b4c5d6e7f80"
ROOTFS_EXTRA = ("python3-venv",)  # the installer makes a venv; the rest is in the test host set


# --- helpers ---------------------------------------------------------------------------------


def build_wheel(dest: Path) -> Path:
    """The nodeprep wheel, built offline from a copy of the source (the work tree stays clean)."""
    src = dest / "src"
    shutil.copytree(REPO / "nodeprep", src / "nodeprep",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    out = dest / "dist"
    runner.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                "--no-index", "-w", out, "./src"], cwd=dest, timeout=300, inherit_env=True)
    (wheel,) = out.glob("nodeprep-*-py3-none-any.whl")
    return wheel


def stage_inputs(work: Path, wheel: Path) -> tuple[Path, Path]:
    """What the operator has before rendering: `wheel` under work/served/tools (the directory the
    loopback store serves) and the bootstrap token in work/token (0600); returns (served, token)."""
    served = work / "served"
    (served / "tools").mkdir(parents=True)
    shutil.copy2(wheel, served / "tools" / wheel.name)
    token = work / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    return served, token


def nodeprep(*args: object, check: bool = False) -> runner.Result:
    env = {"PYTHONPATH": str(REPO), "no_proxy": "127.0.0.1,localhost"}
    return runner.run([sys.executable, "-m", "nodeprep.cli", *args], check=check, timeout=600, env=env,
                      inherit_env=True)


def apply_user_data(user_data: Path, root: Path, out: Path) -> dict:
    """cloud-init's merge + write_files into `root` (see ci_apply.py); returns the merged config."""
    runner.run(["/usr/bin/python3", HERE / "ci_apply.py", user_data, root, out], timeout=120)
    return json.loads(out.read_text())


def write_profile(path: Path, build, store_url: str) -> Path:  # type: ignore[no-untyped-def]
    data = {
        "driver": {"version": build.driver_version, "flavour": build.flavour, "store": store_url,
                   "kernel": build.kernel_release},
        "labels": {"cloud": "none", "extra": {"example.com/team": "ml-platform"}},
        "cluster": {"mode": "kubeadm", "api_server": "10.0.0.10:6443",
                    "token_file": "/etc/nodeprep/bootstrap-token", "ca_cert_hashes": [HASH],
                    "kubernetes_version": "1.31", "taints": ["dedicated=gpu:NoSchedule"], "gpu_taint": True},
    }
    path.write_text("# e2e node\n" + yaml.safe_dump(data, sort_keys=False))
    return path


def tree_state(root: Path, parts: tuple[str, ...]) -> dict[str, tuple[int, int, bytes | str]]:
    """(mtime, mode, content or link target) of every file and link under ROOT/<parts>."""
    out: dict[str, tuple[int, int, bytes | str]] = {}
    for part in parts:
        base = root / part
        if not base.exists():
            continue
        for p in sorted([base, *base.rglob("*")]):
            st = p.lstat()
            if p.is_symlink():
                out[str(p.relative_to(root))] = (st.st_mtime_ns, st.st_mode, os.readlink(p))
            elif p.is_file():
                out[str(p.relative_to(root))] = (st.st_mtime_ns, st.st_mode, p.read_bytes())
    return out


def steps_of(result: runner.Result) -> dict[str, str]:
    data = json.loads(result.stdout)
    return {s["name"]: s["status"] for s in data["steps"]}


# --- tests -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def test_user_data_to_ready_node_resumes_and_is_idempotent(real_build, test_cache: Path,  # type: ignore[no-untyped-def]
                                                            wheel: Path, tmp_path: Path) -> None:
    root = debian_rootfs(test_cache, tmp_path / "root", extra_packages=ROOTFS_EXTRA)
    served, token_file = stage_inputs(tmp_path, wheel)

    with store_server(served) as url:
        profile = write_profile(tmp_path / "node.yaml", real_build, url)
        user_data = tmp_path / "user-data"
        nodeprep("cloud-init", "--profile", profile, "--token-file", token_file, "--nodeprep-wheel", wheel,
                 "--out", user_data, check=True)
        assert "Valid cloud-config" in runner.run(["cloud-init", "schema", "-c", user_data]).stdout
        applied = apply_user_data(user_data, root, tmp_path / "applied.json")
        cfg, script = applied["config"], applied["runcmd_script"]
        assert TOKEN not in script
        install_cmd, bootstrap_cmd, enable_cmd = cfg["runcmd"]
        assert enable_cmd == ["systemctl", "enable", cloudinit.UNIT_NAME]  # no systemd here: not run
        assert bootstrap_cmd == [cloudinit.NODEPREP_BIN, "bootstrap", "--profile", cloudinit.PROFILE_PATH]
        node_token = root / "etc/nodeprep/bootstrap-token"
        assert node_token.read_text() == TOKEN + "\n" and node_token.stat().st_mode & 0o777 == 0o600
        assert (root / "etc/nodeprep/node.yaml").read_text() == profile.read_text()

        # runcmd 1: the installer, inside the node's filesystem, from the store, sha256-checked
        runner.run(["chroot", root, *install_cmd], timeout=300, env={"no_proxy": "127.0.0.1"})
        version = runner.run(["chroot", root, cloudinit.NODEPREP_BIN, "--version"]).stdout
        assert version.strip() == f"nodeprep, version {__version__}"

        # runcmd 2, as `--root` on this machine; the store has no index yet (not published): fails at once
        argv = ["bootstrap", "--root", root, "--profile", root / cloudinit.PROFILE_PATH.lstrip("/"),
                "--dry-run-join", "--nvidia-smi-xml", FIXTURE]
        first = nodeprep(*argv, "--json")
        assert first.returncode != 0
        assert steps_of(first) == {"driver": "failed", "modules": "pending", "mig": "pending",
                                   "labels": "pending", "runtime": "pending", "join": "pending"}
        assert "index.json" in json.loads(first.stdout)["steps"][0]["error"]
        assert not (root / "opt/nvidia").exists()

        # publish the artifacts; the token has not arrived: everything up to the join is done
        for item in real_build.store.iterdir():
            if not item.name.startswith("."):
                (served / item.name).symlink_to(item)
        node_token.unlink()
        second = nodeprep(*argv, "--json")
        assert second.returncode == 2, second.stderr
        assert steps_of(second) == {"driver": "done", "modules": "done", "mig": "done", "labels": "done",
                                    "runtime": "done", "join": "failed"}
        assert "bootstrap-token" in json.loads(second.stdout)["steps"][5]["error"]
        driver_tree = tree_state(root, ("opt/nvidia",))

        # the token arrives (cloud-init's write_files again): the rerun resumes at the join only
        apply_user_data(user_data, root, tmp_path / "applied2.json")
        third = nodeprep(*argv)
        assert third.returncode == 0, third.stderr
        journal = [ln for ln in third.stderr.splitlines() if ln.startswith("bootstrap: ")]
        done_before = ("driver", "modules", "mig", "labels", "runtime")
        assert journal[:5] == [f"bootstrap: {s}: already done" for s in done_before]
        assert journal[5].startswith("bootstrap: join: done in ") and "dry run" in journal[5]
        assert journal[6].startswith("bootstrap: node ready in ")
        assert tree_state(root, ("opt/nvidia",)) == driver_tree
        for r in (first, second, third):
            assert TOKEN not in r.stdout + r.stderr

    v, k = real_build.driver_version, real_build.kernel_release
    # driver root
    assert os.readlink(root / "opt/nvidia/current") == v
    assert (root / f"opt/nvidia/{v}/modules/{k}/nvidia.ko").is_file()
    modinfo = runner.run(["modinfo", "-F", "version", root / f"opt/nvidia/{v}/modules/{k}/nvidia.ko"]).stdout
    assert modinfo.strip() == v
    # ld cache, as the node's own ldconfig reads it
    cache = runner.run(["chroot", root, "ldconfig", "-p"]).stdout
    entries = [(ln.split()[0], ln.split("=>")[1].strip()) for ln in cache.splitlines() if "=>" in ln]
    for lib in ("libcuda.so.1", "libnvidia-ml.so.1"):
        paths = [path for name, path in entries if name == lib]
        # the versioned root through `current`, and the entry point where NVIDIA's tools look
        assert f"/opt/nvidia/current/lib64/{lib}" in paths, paths
        for path in paths:  # every one of them resolves into the active version
            real = os.path.realpath(root / path.lstrip("/"))
            assert real.startswith(str((root / f"opt/nvidia/{v}").resolve())), (path, real)
    # labels: NFD feature file and the JSON the join used
    nfd = parse_nfd((root / "etc/kubernetes/node-feature-discovery/features.d/nodeprep").read_text())
    assert nfd["nvidia.com/gpu.product"] == "Tesla-T4"
    assert nfd["nvidia.com/gpu.count"] == "1"
    assert nfd["example.com/team"] == "ml-platform"
    assert nfd["nodeprep.dev/driver-version"] == v and nfd["nodeprep.dev/kernel"] == k
    labels = json.loads((root / "etc/nodeprep/labels.json").read_text())
    assert {key: labels[key] for key in nfd} == nfd
    # kubeadm JoinConfiguration, parsed back
    join_file = root / "etc/nodeprep/kubeadm-join.yaml"
    assert join_file.stat().st_mode & 0o777 == 0o600
    doc = yaml.safe_load(join_file.read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("kubeadm.k8s.io/v1beta4", "JoinConfiguration")
    assert doc["discovery"]["bootstrapToken"]["token"] == TOKEN
    assert doc["discovery"]["bootstrapToken"]["caCertHashes"] == [HASH]
    assert doc["discovery"]["bootstrapToken"]["apiServerEndpoint"] == "10.0.0.10:6443"
    reg = doc["nodeRegistration"]
    # nodeprep.dev/unverified: the node stays unschedulable until `nodeprep verify-nodes` sees its
    # GPU self-test verdict (cluster.verify_gpus, default true; docs/join.md)
    assert {(t["key"], t["effect"]) for t in reg["taints"]} == {("dedicated", "NoSchedule"),
                                                               ("nvidia.com/gpu", "NoSchedule"),
                                                               ("nodeprep.dev/unverified", "NoSchedule")}
    flag = next(a["value"] for a in reg["kubeletExtraArgs"] if a["name"] == "node-labels")
    node_labels = dict(kv.split("=", 1) for kv in flag.split(","))
    assert node_labels["nvidia.com/gpu.product"] == "Tesla-T4"
    assert node_labels["example.com/team"] == "ml-platform"
    # container runtime: drop-in and CDI spec for the active root
    assert (root / "etc/containerd/conf.d").is_dir() and any((root / "etc/containerd/conf.d").iterdir())
    cdi = yaml.safe_load((root / "etc/cdi/nvidia.yaml").read_text())
    assert "/opt/nvidia/" in json.dumps(cdi)
    # progress record
    state = json.loads((root / "var/lib/nodeprep/bootstrap.json").read_text())
    (run,) = state["runs"].values()
    assert {n: s["status"] for n, s in run["steps"].items()} == dict.fromkeys(
        ("driver", "modules", "mig", "labels", "runtime", "join"), "done")

    # a rerun after success changes nothing
    watched = ("opt", "etc", "var/lib/nodeprep", "usr/local", "lib/modules")
    before = tree_state(root, watched)
    again = nodeprep(*argv, "--json")
    assert again.returncode == 0
    steps = steps_of(again)
    # a --dry-run-join result is provisional (issue 28): the rerun runs that step again (reported as
    # a change), and it writes the same files, so the tree below is the same
    assert steps.pop("join") == "done", steps
    assert set(steps.values()) == {"skipped"}
    record = "var/lib/nodeprep/bootstrap.json"  # the run's own record of that step, rewritten
    after = tree_state(root, watched)
    assert {k: v for k, v in after.items() if k != record} == {k: v for k, v in before.items() if k != record}
    shutil.rmtree(root)


def test_installer_refuses_a_wheel_with_the_wrong_sha256(test_cache: Path, wheel: Path,
                                                         tmp_path: Path) -> None:
    """The store serves other bytes than the user-data pinned: nothing is installed."""
    root = debian_rootfs(test_cache, tmp_path / "root", extra_packages=ROOTFS_EXTRA)
    served = tmp_path / "served"
    (served / "tools").mkdir(parents=True)
    (served / "tools" / wheel.name).write_bytes(wheel.read_bytes() + b"tampered")
    profile = tmp_path / "node.yaml"
    with store_server(served) as url:
        profile.write_text(f'driver:\n  version: "535.309.01"\n  store: {url}\n')
        user_data = tmp_path / "user-data"
        nodeprep("cloud-init", "--profile", profile, "--nodeprep-wheel", wheel, "--out", user_data,
                 check=True)
        cfg = apply_user_data(user_data, root, tmp_path / "applied.json")["config"]
        bad_args = runner.run(["chroot", root, cloudinit.INSTALLER_PATH, "python3", "bogus"], check=False)
        assert bad_args.returncode == 2 and bad_args.stderr.startswith("usage: install-nodeprep")
        with pytest.raises(CommandError) as e:
            runner.run(["chroot", root, *cfg["runcmd"][0]], timeout=300, env={"no_proxy": "127.0.0.1"})
        assert "sha256 mismatch" in e.value.tail
    link = root / "usr/local/bin/nodeprep"
    assert not link.exists() and not link.is_symlink()
    assert not list((root / "opt/nodeprep/venv").glob("lib/python3*/site-packages/nodeprep"))
    shutil.rmtree(root)
