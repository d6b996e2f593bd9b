"""`runtime --root R` and `join --root R` never write outside R through the image's links or the
profile's paths (issue #25): ROOT/etc/cdi, ROOT/etc/containerd, ROOT/etc/kubernetes,
ROOT/var/lib/kubelet and ROOT/etc/systemd as absolute links to a directory outside the root, or as
`../` links that climb out of it lexically, resolve inside the root as on the booted node; a profile
path with `..` stays beneath it. The outside directory is byte-identical afterwards.

The real CLI runs against a root with a driver installed by the real artifact code (conftest.py).
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from nodeprep.cli import main
from nodeprep.profile.model import Runtime
from nodeprep.runtime.containerd import plan_containerd
from nodeprep.runtime.files import apply_changes
from tests.support.standin import tree

from .test_join import join_args, profile


def run(args: list[str]) -> tuple[int, str]:
    r = CliRunner().invoke(main, args)
    return r.exit_code, r.output


def _outside(tmp_path: Path) -> Path:
    out = tmp_path / "outside"
    for d in ("cdi", "containerd", "kubernetes", "kubelet", "systemd/system"):
        (out / d).mkdir(parents=True)
        (out / d / "keep").write_text(f"host's {d}\n")
    (out / "containerd/config.toml").write_text('version = 2\n# the host\'s own containerd config\n')
    return out


def _link(root: Path, link: str, out: Path, name: str, how: str) -> Path:
    """ROOT/link -> outside/name (absolute, or `../` enough to get there lexically); returns where
    it resolves beneath the root."""
    (root / link).parent.mkdir(parents=True, exist_ok=True)
    if how == "absolute":
        (root / link).symlink_to(out / name)
        return root / str(out / name).lstrip("/")
    depth = len((root / link).relative_to(root.parent).parts) - 1
    (root / link).symlink_to("../" * depth + f"{out.name}/{name}")
    assert (root / link).resolve() == out / name
    return root / out.name / name


def _runtime_profile(tmp_path: Path, **runtime: object) -> Path:
    path = tmp_path / "runtime.yaml"
    path.write_text(yaml.safe_dump({"driver": {"version": "535.309.01"},
                                    "runtime": {"default_runtime": True, **runtime}}))
    return path


@pytest.mark.parametrize("how", ["absolute", "relative"])
def test_runtime_writes_beneath_the_root(node_root: Path, tmp_path: Path, smi_xml: Path, how: str) -> None:
    out = _outside(tmp_path)
    cdi = _link(node_root, "etc/cdi", out, "cdi", how)
    containerd = _link(node_root, "etc/containerd", out, "containerd", how)
    before = tree(out)
    code, output = run(["runtime", "--profile", str(_runtime_profile(tmp_path)), "--root", str(node_root),
                        "--nvidia-smi-xml", str(smi_xml)])
    assert code == 0, output
    assert tree(out) == before
    assert (cdi / "nvidia.yaml").read_text().startswith("# Written by nodeprep")
    assert (containerd / "conf.d/99-nodeprep-nvidia.toml").is_file()
    assert 'imports = ["/etc/containerd/conf.d/*.toml"]' in (containerd / "config.toml").read_text()


@pytest.mark.parametrize("how", ["absolute", "relative"])
def test_join_writes_beneath_the_root(node_root: Path, tmp_path: Path, smi_xml: Path, how: str) -> None:
    """The image keeps /etc/nodeprep (the token file included) behind a link: the join reads the
    token there and writes its files there, never the host's directory of that name."""
    out = _outside(tmp_path)
    (out / "nodeprep").mkdir()
    (out / "nodeprep/bootstrap-token").write_text("abcdef.0123456789abcdef\n")  # the host's: unused
    (out / "nodeprep/bootstrap-token").chmod(0o600)
    token = (node_root / "etc/nodeprep/bootstrap-token").read_bytes()
    shutil.rmtree(node_root / "etc/nodeprep")
    nodeprep = _link(node_root, "etc/nodeprep", out, "nodeprep", how)
    nodeprep.mkdir(parents=True)
    (nodeprep / "bootstrap-token").write_bytes(token)
    (nodeprep / "bootstrap-token").chmod(0o600)
    cdi = _link(node_root, "etc/cdi", out, "cdi", how)
    containerd = _link(node_root, "etc/containerd", out, "containerd", how)
    before = tree(out)
    code, output = run(join_args(node_root, profile(tmp_path), smi_xml))
    assert code == 0, output
    assert tree(out) == before
    assert token.decode().strip() in (nodeprep / "kubeadm-join.yaml").read_text()
    assert (nodeprep / "kubeadm-patches/kubeletconfiguration+merge.yaml").is_file()
    assert (cdi / "nvidia.yaml").is_file() and (containerd / "conf.d/99-nodeprep-nvidia.toml").is_file()


def test_profile_paths_with_dotdot_stay_beneath_the_root(node_root: Path, tmp_path: Path,
                                                         smi_xml: Path) -> None:
    """The writers are confined whatever the profile says: `..` stops at the root."""
    escape = tmp_path / "x"
    runtime = replace(Runtime(), containerd_config="/etc/../../../x/containerd.toml")
    written = apply_changes(plan_containerd(node_root, runtime))
    assert [c.path for c in written] == [node_root / "x/containerd.toml",
                                         node_root / "x/conf.d/99-nodeprep-nvidia.toml"]
    assert not escape.exists()

    other = tmp_path / "other"
    other.mkdir()
    prof = _runtime_profile(other, containerd_config="/etc/../../../y/c.toml")
    code, output = run(["runtime", "--root", str(node_root), "--nvidia-smi-xml", str(smi_xml),
                        "--profile", str(prof)])
    assert code in (0, 2), output  # written beneath the root, or refused by the profile's check
    assert not (tmp_path / "y").exists() and not (tmp_path.parent / "y").exists()
    assert (node_root / "y/c.toml").is_file() == (code == 0)
