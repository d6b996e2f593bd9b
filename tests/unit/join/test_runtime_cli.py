"""`nodeprep runtime` and `nodeprep profile` through click's CliRunner, and the check-mode sequence the
Ansible container_runtime role relies on: check -> changed, apply -> changed, re-apply -> unchanged,
check -> unchanged (the ansible-core deb822_repository integration pattern)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner

from nodeprep.cli import main
from nodeprep.join import JoinOptions, plan_join
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
        "/etc/cdi/nvidia.yaml",
    ]
    code, out, _ = run(base)
    apply1 = json.loads(out)
    assert code == 0 and apply1["changed"] is True and len(apply1["written"]) == 3
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
    ]
    assert any("CDI spec not written" in w for w in data["warnings"])
    assert not (node_root / "etc/cdi").exists()
