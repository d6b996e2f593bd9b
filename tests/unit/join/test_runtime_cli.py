"""`nodeprep runtime` and `nodeprep profile` through click's CliRunner, and the check-mode sequence the
Ansible container_runtime role relies on: check -> changed, apply -> changed, re-apply -> unchanged,
check -> unchanged (the ansible-core deb822_repository integration pattern)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner

from nodeprep.cli import main
from nodeprep.join.joinplan import JoinOptions, plan_join
from nodeprep.profile import load_profile

REPO = Path(__file__).resolve().parents[3]


def run(args: list[str]) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, args, catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def _profile(tmp_path: Path) -> Path:
    path = tmp_path / "node.yaml"
    path.write_text(
        yaml.safe_dump({"driver": {"version": "535.309.01"}, "runtime": {"default_runtime": True}})
    )
    return path


def test_check_apply_reapply_check(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    base = [
        "runtime",
        "--profile",
        str(_profile(tmp_path)),
        "--root",
        str(node_root),
        "--nvidia-smi-xml",
        str(smi_xml),
        "--json",
    ]
    code, out, _ = run([*base, "--check"])
    check1 = json.loads(out)
    assert code == 0 and check1["changed"] is True
    assert not (node_root / "etc/cdi/nvidia.yaml").exists()  # check mode writes nothing
    assert [f["path"] for f in check1["files"]] == [
        "/etc/containerd/config.toml",
        "/etc/containerd/conf.d/99-nodeprep-nvidia.toml",
        "/etc/nvidia-container-runtime/config.toml",
        "/usr/libexec/nodeprep/cdi-hook.modules",  # what the hook program the gate and the spec run loads
        "/usr/libexec/nodeprep/cdi-hook",
        "/usr/share/containers/oci/hooks.d/99-nodeprep-cuda-gate.json",  # the CUDA gate (hooks.d)
        "/etc/cdi/nvidia.yaml",
    ]
    code, out, _ = run(base)
    apply1 = json.loads(out)
    assert code == 0 and apply1["changed"] is True and len(apply1["written"]) == 7
    assert apply1["ran"] == []  # --root is not the live system: containerd is not restarted
    code, out, _ = run(base)
    assert code == 0 and json.loads(out)["changed"] is False and json.loads(out)["written"] == []
    code, out, _ = run([*base, "--check"])
    assert code == 0 and json.loads(out)["changed"] is False


def test_profile_check_and_schema(tmp_path: Path) -> None:
    code, out, _ = run(["profile", "check", "--profile", str(REPO / "examples/node.yaml")])
    assert code == 0 and out.strip().endswith("examples/node.yaml: ok")
    code, out, _ = run(["profile", "check", "--json", "--profile", str(REPO / "examples/node.yaml")])
    assert code == 0 and json.loads(out)["driver"]["version"] == "535.309.01"
    code, out, _ = run(["profile", "schema"])
    assert code == 0 and json.loads(out)["title"] == "nodeprep node profile"
    bad = tmp_path / "bad.yaml"
    bad.write_text("driver: {version: '535', flavor: open}\n")
    code, out, err = run(["profile", "check", "--profile", str(bad)])
    assert code == 2 and out == ""
    first = err.splitlines()[0]
    assert first.startswith(f"error: {bad}: ")
    assert "driver.flavor: unknown key (did you mean 'flavour'?)" in first
    assert "driver.version: '535' is not a full driver version" in first
    assert "Traceback" not in err


def test_already_joined_node_is_not_joined_again(node_root: Path, smi_xml: Path) -> None:
    (node_root / "etc/kubernetes").mkdir(parents=True)
    (node_root / "etc/kubernetes/kubelet.conf").write_text("apiVersion: v1\nkind: Config\n")
    prof = load_profile(REPO / "examples/node.yaml")
    plan = plan_join(
        prof,
        JoinOptions(
            root=node_root, skip_preflight=True, nvidia_smi_xml=smi_xml, labels={"example.com/team": "ml"}
        ),
    )
    assert plan.already_joined
    assert not any(a.argv[:2] == ("kubeadm", "join") for a in plan.actions)
    assert any("already joined" in w for w in plan.warnings)


def test_offline_root_without_gpu_facts_skips_the_cdi_spec(node_root: Path, tmp_path: Path) -> None:
    """An image root at build time: no driver procfs, no GPUs in its sysfs, no capture."""
    code, out, err = run(
        ["runtime", "--profile", str(_profile(tmp_path)), "--root", str(node_root), "--json"]
    )
    assert code == 0
    data = json.loads(out)
    assert [f["path"] for f in data["files"]] == [
        "/etc/containerd/config.toml",
        "/etc/containerd/conf.d/99-nodeprep-nvidia.toml",
        "/etc/nvidia-container-runtime/config.toml",
        "/usr/libexec/nodeprep/cdi-hook.modules",
        "/usr/libexec/nodeprep/cdi-hook",
        "/usr/share/containers/oci/hooks.d/99-nodeprep-cuda-gate.json",
    ]
    assert any("CDI spec not written" in w for w in data["warnings"])
    assert not (node_root / "etc/cdi").exists()


def test_missing_nvidia_container_runtime_is_one_line(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    """No NVIDIA Container Toolkit in this root: the drop-in still registers the `nvidia` runtime
    (installing the toolkit later makes it work), runtime and activation say so in one line."""
    from nodeprep.join.activation import CALLBACKS
    from nodeprep.node import switch

    args = ["runtime", "--profile", str(_profile(tmp_path)), "--root", str(node_root),
            "--nvidia-smi-xml", str(smi_xml)]
    code, _, err = run(args)
    lines = [line for line in err.splitlines() if "nvidia-container-runtime is not installed" in line]
    assert code == 0 and lines == [
        "warning: nvidia-container-runtime is not installed (/usr/bin/nvidia-container-runtime): the "
        "containerd runtime `nvidia` (RuntimeClass nvidia) cannot start containers; CDI devices "
        "(nvidia.com/gpu=...) work without it"
    ], err
    assert (node_root / "etc/cdi/nvidia.yaml").exists()
    (node_root / "usr/bin").mkdir(parents=True, exist_ok=True)
    (node_root / "usr/bin/nvidia-container-runtime").write_bytes(b"\x7fELF")
    code, _, err = run(args)
    assert code == 0 and "nvidia-container-runtime is not installed" not in err
    (node_root / "usr/bin/nvidia-container-runtime").unlink()
    notes = switch.activate(node_root, "535.309.01", load=False, callbacks=CALLBACKS).notes
    assert any(n.startswith("nvidia-container-runtime is not installed") for n in notes), notes


def test_spec_directory_not_writable_changes_nothing(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    """An immutable /etc/cdi (chattr +i; root ignores mode bits): one error line naming the file,
    exit 2, and neither the containerd files nor the spec written."""
    import shutil
    import subprocess

    if shutil.which("chattr") is None:
        import pytest

        pytest.skip("chattr (e2fsprogs) is needed to make a directory unwritable for root")
    cdi_dir = node_root / "etc/cdi"
    cdi_dir.mkdir(parents=True)
    subprocess.run(["chattr", "+i", str(cdi_dir)], check=True)
    try:
        code, out, err = run(["runtime", "--profile", str(_profile(tmp_path)), "--root", str(node_root),
                              "--nvidia-smi-xml", str(smi_xml)])
    finally:
        subprocess.run(["chattr", "-i", str(cdi_dir)], check=True)
    assert code == 2
    first = err.splitlines()[0]
    assert first == f"error: cannot write /etc/cdi/nvidia.yaml: directory {cdi_dir} is not writable"
    assert not (node_root / "etc/containerd").exists() and list(cdi_dir.iterdir()) == []


def test_dev_root_is_where_device_nodes_are_looked_up(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    """An image build: the driver root is the image (--root), the device nodes are the build
    host's or a booted node's (--dev-root)."""
    dev_root = tmp_path / "devroot"
    (dev_root / "dev").mkdir(parents=True)
    (dev_root / "dev/nvidia-modeset").write_text("")
    profile = tmp_path / "node.yaml"  # nvidia-modeset not loaded by nodeprep: only its node says it is there
    profile.write_text(yaml.safe_dump({"driver": {"version": "535.309.01", "modules": ["nvidia"]}}))
    base = ["runtime", "--profile", str(profile), "--root", str(node_root), "--nvidia-smi-xml", str(smi_xml)]
    code, _, err = run([*base, "--dev-root", str(tmp_path / "missing")])
    assert code == 2 and "--dev-root" in err and not (node_root / "etc/cdi/nvidia.yaml").exists()
    code, _, err = run([*base, "--dev-root", str(dev_root)])
    assert code == 0, err
    spec = yaml.safe_load((node_root / "etc/cdi/nvidia.yaml").read_text())
    assert {"path": "/dev/nvidia-modeset"} in spec["containerEdits"]["deviceNodes"]
    assert not (node_root / "dev/nvidia-modeset").exists()


def test_runtime_takes_the_ca_pin_opt_out(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    """A kubeadm profile without CA pins is refused (exit 2, the field named) unless the node joins
    with --insecure-skip-ca-verification, which runtime (and the Ansible runtime module) take too."""
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump({"driver": {"version": "535.309.01"},
                                    "cluster": {"api_server": "10.0.0.10:6443"}}))
    args = ["runtime", "--profile", str(path), "--root", str(node_root), "--nvidia-smi-xml", str(smi_xml),
            "--check", "--json"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and "cluster.ca_cert_hashes" in r.output, r.output
    code, out, _ = run([*args, "--insecure-skip-ca-verification"])
    assert code == 0 and json.loads(out)["changed"] is True
