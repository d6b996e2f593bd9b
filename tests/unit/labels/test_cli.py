"""`nodeprep labels` through click's CliRunner: every format parses back, bad input exits 2 with one
line. All inputs live in temp dirs; --apply against a real API server is in tests/slow/labels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from nodeprep import runner
from nodeprep.cli import main
from nodeprep.labels.output import parse_nfd

from .conftest import write_dmi

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def base_args(empty_sysfs: Path, empty_root: Path, tmp_path: Path, nvidia_smi_fixtures: Path) -> list[str]:
    dmi = write_dmi(tmp_path / "dmi", sys_vendor="Amazon EC2", product_name="g4dn.xlarge")
    return ["labels", "--root", str(empty_root), "--sysfs-root", str(empty_sysfs), "--dmi-root", str(dmi),
            "--nvidia-smi-xml", str(nvidia_smi_fixtures / "tesla-t4_515.105.01.xml"), "--cloud", "none"]


def run(args: list[str]) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, args, catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def test_json_and_yaml_parse_back(base_args: list[str]) -> None:
    code, out, _ = run([*base_args, "--label", "example.com/team=ml",
                        "--label", "node-role.kubernetes.io/gpu="])
    assert code == 0
    data = json.loads(out)
    labels = data["labels"]
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4"
    assert labels["nvidia.com/gpu.machine"] == "g4dn.xlarge"
    assert labels["node.kubernetes.io/instance-type"] == "g4dn.xlarge"
    assert labels["example.com/team"] == "ml"
    assert data["needs_api"] == ["node-role.kubernetes.io/gpu"]
    assert "node.kubernetes.io/instance-type" in data["self_settable"]
    assert data["sources"]["gpu"] == "nvidia-smi"
    assert data["facts"]["gpu"]["gpus"][0]["memory_mib"] == 15360
    code, out, _ = run([*base_args, "--format", "yaml", "--label", "example.com/team=ml",
                        "--label", "node-role.kubernetes.io/gpu="])
    assert code == 0 and yaml.safe_load(out)["labels"] == labels


def test_kubelet_format(base_args: list[str]) -> None:
    code, out, _ = run([*base_args, "--format", "kubelet", "--label", "example.com/team=ml"])
    assert code == 0 and out.endswith("\n") and out.count("\n") == 1
    pairs = dict(p.split("=", 1) for p in out.strip().split(","))
    _, js, _ = run([*base_args, "--json", "--label", "example.com/team=ml"])
    assert pairs == json.loads(js)["labels"]


def test_kubelet_format_refuses_node_role(base_args: list[str]) -> None:
    code, out, err = run([*base_args, "--format", "kubelet", "--label", "node-role.kubernetes.io/worker="])
    assert code == 2 and out == ""
    assert err.startswith("error: labels not allowed in kubelet --node-labels: "
                          "node-role.kubernetes.io/worker")
    assert "admin client" in err


def test_nfd_file(base_args: list[str], tmp_path: Path) -> None:
    out_file = tmp_path / "features.d" / "nodeprep"
    code, out, _ = run([*base_args, "--format", "nfd", "--out", str(out_file)])
    assert code == 0 and out == ""
    text = out_file.read_text()
    nfd = parse_nfd(text)
    assert nfd["nvidia.com/gpu.product"] == "Tesla-T4" and nfd["nvidia.com/gpu.count"] == "1"
    assert not [k for k in nfd if "kubernetes.io" in k]
    assert "node.kubernetes.io/instance-type" in text.splitlines()[1]  # listed as left out
    assert out_file.stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("bad", ["bad key=x", "novalue", "example.com/x=" + "v" * 64, "Example.COM/x=1"])
def test_invalid_label_exit_2_one_line(base_args: list[str], bad: str) -> None:
    code, out, err = run([*base_args, "--label", bad])
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"error: invalid --label {bad!r}")


def test_profile_labels_and_bad_profile(base_args: list[str], tmp_path: Path) -> None:
    code, out, _ = run([*base_args, "--profile", str(REPO / "examples/node.yaml")])
    assert code == 0
    labels = json.loads(out)["labels"]
    assert labels["example.com/team"] == "ml-platform" and labels["node.kubernetes.io/pool"] == "gpu-a"
    code, out, _ = run([*base_args, "--profile", str(REPO / "examples/node.yaml"),
                        "--label", "example.com/team=infra"])
    assert json.loads(out)["labels"]["example.com/team"] == "infra"  # the flag wins
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "examples/node.yaml").read_text().replace("example.com/team:", "'bad key':"))
    code, out, err = run([*base_args, "--profile", str(bad)])
    assert code == 2 and "labels.extra" in err and "bad key" in err


def test_apply_needs_a_kubeconfig(base_args: list[str]) -> None:
    """--apply itself runs against a real API server: tests/slow/labels/test_labels_apiserver.py."""
    code, _, err = run([*base_args, "--apply"])
    assert code == 2 and "needs --kubeconfig" in err


def test_help() -> None:
    code, out, _ = run(["labels", "--help"])
    assert code == 0 and "--format" in out and "--apply" in out


def test_source_names_the_only_gpu_fact_source(empty_sysfs: Path, empty_root: Path, tmp_path: Path,
                                               base_args: list[str]) -> None:
    """`--source nvml|nvidia-smi` asks that source only and fails (exit 1, the reason given) when it has
    nothing to say - there is no driver here (`nvidia-smi` under an image root without one on this host's
    PATH: refused, exit 2, test_image_never_run.py); `--source pci` reads sysfs only (no GPU in it here:
    exit 1 too); a capture and --source
    exclude each other (the GPU acceptance tier, acceptance/gpu/, relies on all three)."""
    dmi = write_dmi(tmp_path / "dmi2", sys_vendor="Dell Inc.", product_name="PowerEdge")
    args = ["labels", "--root", str(empty_root), "--sysfs-root", str(empty_sysfs), "--dmi-root", str(dmi),
            "--cloud", "none"]
    for source in ("nvml", "nvidia-smi"):
        code, out, err = run([*args, "--source", source])
        if source == "nvidia-smi" and runner.which("nvidia-smi") is None:  # the image's is never run (#35)
            assert code == 2 and out == "" and "this host has no nvidia-smi on PATH" in err
            continue
        assert code == 1 and out == ""
        assert err.startswith(f"error: --source {source}: no GPU facts from it (got: pci); gpu: {source} "
                              "unavailable: ")
    code, out, err = run([*args, "--source", "pci"])  # sysfs read, no NVIDIA device in it
    assert code == 1 and out == "" and err.startswith("error: --source pci: no NVIDIA GPU found (")
    code, _, err = run([*base_args, "--source", "nvml"])
    assert code == 2 and "--source: not with --nvidia-smi-xml" in err


def test_root_reads_its_own_sysfs(tmp_path: Path, nvidia_smi_fixtures: Path) -> None:
    """`labels --root R` reads R/sys like `doctor --root R` does, never this host's /sys: a GPU in
    R/sys is found through --source pci, and a root without one is exit 1 with one line (docs/labels.md:
    a named source with nothing to say is an error), not exit 0 with no GPU labels."""
    root = tmp_path / "root"
    dev = root / "sys/bus/pci/devices/0000:3b:00.0"
    dev.mkdir(parents=True)
    for name, value in (("vendor", "0x10de"), ("device", "0x1eb8"), ("class", "0x030200")):
        (dev / name).write_text(value + "\n")
    args = ["labels", "--root", str(root), "--cloud", "none", "--source", "pci"]
    code, out, err = run(args)
    assert code == 0, err
    data = json.loads(out)
    assert data["sources"]["gpu"] == "pci" and data["labels"]["nvidia.com/gpu.count"] == "1"
    empty = tmp_path / "empty"
    (empty / "sys/bus/pci/devices").mkdir(parents=True)
    code, out, err = run(["labels", "--root", str(empty), "--cloud", "none", "--source", "pci"])
    assert code == 1 and out == ""
    assert err.splitlines()[0] == (f"error: --source pci: no NVIDIA GPU found ({empty}/sys/bus/pci/devices "
                                   "has no device with vendor 10de)")
