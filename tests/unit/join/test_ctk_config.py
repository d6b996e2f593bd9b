"""`nodeprep runtime` writes nvidia-container-runtime's config.toml for CDI mode (issue 26, item 4):
from nothing, over a packaged file whose other settings stay, not at all without CDI, and never over
a file that is not TOML. Through the real CLI (click's CliRunner) against a node root; that NVIDIA's
real runtime reads the file and injects from nodeprep's spec: tests/slow/join/test_nvidia_runtime.py."""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml
from click.testing import CliRunner

from nodeprep.cli import main

CONFIG = "etc/nvidia-container-runtime/config.toml"
PACKAGED = """\
#accept-nvidia-visible-devices-as-volume-mounts = false
disable-require = false

[nvidia-container-cli]
ldconfig = "@/sbin/ldconfig.real"

[nvidia-container-runtime]
log-level = "info"
mode = "auto"
runtimes = ["docker-runc", "runc", "crun"]

[nvidia-container-runtime.modes.cdi]
annotation-prefixes = ["cdi.k8s.io/"]
default-kind = "nvidia.com/gpu"
spec-dirs = ["/etc/cdi", "/var/run/cdi"]
"""


def run(args: list[str]) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, args, catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def runtime(root: Path, tmp_path: Path, smi_xml: Path, **section: object) -> tuple[int, str, str]:
    prof = tmp_path / "node.yaml"
    prof.write_text(yaml.safe_dump({"driver": {"version": "535.309.01"}, "runtime": section}))
    return run(["runtime", "--profile", str(prof), "--root", str(root), "--nvidia-smi-xml", str(smi_xml)])


def test_written_from_nothing_then_unchanged(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    code, out, err = runtime(node_root, tmp_path, smi_xml, cdi_spec_dirs=["/etc/cdi"])
    assert code == 0, err
    assert "/etc/nvidia-container-runtime/config.toml: changed" in out
    data = tomllib.loads((node_root / CONFIG).read_text())
    assert data == {"nvidia-container-runtime": {"mode": "cdi", "modes": {"cdi": {
        "default-kind": "nvidia.com/gpu", "spec-dirs": ["/etc/cdi"]}}}}
    assert ((node_root / CONFIG).stat().st_mode & 0o777) == 0o644
    code, out, _ = runtime(node_root, tmp_path, smi_xml, cdi_spec_dirs=["/etc/cdi"])
    assert code == 0 and "/etc/nvidia-container-runtime/config.toml: unchanged" in out


def test_packaged_settings_are_kept(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    path = node_root / CONFIG
    path.parent.mkdir(parents=True)
    path.write_text(PACKAGED)
    path.chmod(0o600)
    code, _, err = runtime(node_root, tmp_path, smi_xml)
    assert code == 0, err
    want = tomllib.loads(PACKAGED)
    want["nvidia-container-runtime"]["mode"] = "cdi"
    assert tomllib.loads(path.read_text()) == want
    assert (path.stat().st_mode & 0o777) == 0o600


def test_not_written_without_cdi_or_the_runtime(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    for section in ({"cdi": False}, {"nvidia_runtime": False}):
        code, out, err = runtime(node_root, tmp_path, smi_xml, **section)
        assert code == 0, err
        assert "nvidia-container-runtime/config.toml" not in out
        assert not (node_root / CONFIG).exists()


def test_a_config_that_is_not_toml_is_refused_and_nothing_changes(
    node_root: Path, tmp_path: Path, smi_xml: Path
) -> None:
    path = node_root / CONFIG
    path.parent.mkdir(parents=True)
    for bad in ("[nvidia-container-runtime\nmode = 1\n", 'nvidia-container-runtime = "cdi"\n',
                "[nvidia-container-runtime]\nmodes = 3\n"):
        path.write_text(bad)
        before = {p: p.read_bytes() for p in node_root.rglob("*") if p.is_file()}
        code, out, err = runtime(node_root, tmp_path, smi_xml)
        assert code == 2, err
        assert err.startswith("error: /etc/nvidia-container-runtime/config.toml: ") and "Traceback" not in err
        assert {p: p.read_bytes() for p in node_root.rglob("*") if p.is_file()} == before
