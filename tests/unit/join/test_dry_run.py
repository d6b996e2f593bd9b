"""`nodeprep join --dry-run` changes nothing: not under --root, not on the live system (checked in a
private mount namespace whose / is read-only, where any write fails), and `--output-dir DIR` puts
the files it would write under DIR. Logged paths are the real ones (under --root); a root's
`nodeprep.dev/kernel` label is the root's kernel; each warning is printed once. GPU facts come from
a real `nvidia-smi -q -x` capture or from nowhere (no GPU here); see conftest.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nodeprep.join.plan import JoinOptions, plan_join
from nodeprep.labels.system import root_kernel
from nodeprep.profile import parse_profile

from .conftest import REPO, TOKEN
from .test_join import join_args, profile, run_join


def snapshot(root: Path) -> dict[str, tuple[int, bytes | str | None]]:
    """Every path under root with its mode and content (file bytes, link target)."""
    out: dict[str, tuple[int, bytes | str | None]] = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        body = os.readlink(p) if p.is_symlink() else (p.read_bytes() if p.is_file() else None)
        out[str(p.relative_to(root))] = (st.st_mode, body)
    return out


def test_dry_run_writes_nothing_under_the_root(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    before = snapshot(node_root)
    code, out, err = run_join(join_args(node_root, profile(tmp_path), smi_xml, "--check"))
    assert code == 0, err
    assert snapshot(node_root) == before
    for target in ("/etc/containerd/config.toml", "/etc/containerd/conf.d/99-nodeprep-nvidia.toml",
                   "/usr/libexec/nodeprep/cdi-hook", "/etc/cdi/nvidia.yaml",
                   "/etc/nodeprep/kubeadm-join.yaml",
                   "/etc/nodeprep/kubeadm-patches/kubeletconfiguration+merge.yaml"):
        assert f"# ---- {target} (mode " in out
    assert "wrote " not in err and "would write 6 file(s), nothing changed" in err
    code, js, _ = run_join(join_args(node_root, profile(tmp_path), smi_xml, "--check", "--json"))
    data = json.loads(js)
    assert code == 0 and data["dry_run"] is True and data["written"] == [] and data["preview"] == []
    assert snapshot(node_root) == before


def test_check_is_the_flag_and_dry_run_a_deprecated_alias(node_root: Path, tmp_path: Path,
                                                          smi_xml: Path) -> None:
    """`--check` is the one documented "show the plan" flag; `--dry-run` still works, hidden from
    --help, with one `warning:` line; both print the same plan and write nothing."""
    before = snapshot(node_root)
    code, new, err = run_join(join_args(node_root, profile(tmp_path), smi_xml, "--check"))
    assert code == 0 and "use --check" not in err
    code, old, err = run_join(join_args(node_root, profile(tmp_path), smi_xml, "--dry-run"))
    assert code == 0 and old == new and "# ---- /etc/cdi/nvidia.yaml" in new
    assert [line for line in err.splitlines() if "use --check" in line] == [
        "warning: --dry-run is deprecated; use --check"]
    assert snapshot(node_root) == before
    helptext = run_join(["join", "--help"])[1]
    assert "--check" in helptext and "--dry-run" not in helptext


def test_output_dir_holds_what_a_join_would_write(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    before = snapshot(node_root)
    out_dir = tmp_path / "preview"
    code, js, err = run_join(join_args(node_root, profile(tmp_path), smi_xml, "--check", "--output-dir",
                                       str(out_dir), "--json"))
    assert code == 0, err
    assert snapshot(node_root) == before
    preview = sorted(json.loads(js)["preview"])
    assert preview == sorted(str(p) for p in out_dir.rglob("*") if p.is_file()) and len(preview) == 6
    join_file = out_dir / "etc/nodeprep/kubeadm-join.yaml"
    assert (join_file.stat().st_mode & 0o777) == 0o600
    assert yaml.safe_load(join_file.read_text())["discovery"]["bootstrapToken"]["token"] == TOKEN
    # the same bytes a real (offline) join then writes under the root
    assert run_join(join_args(node_root, profile(tmp_path), smi_xml))[0] == 0
    for p in preview:
        rel = Path(p).relative_to(out_dir)
        assert (node_root / rel).read_bytes() == Path(p).read_bytes(), rel
    code, _, err = run_join(join_args(node_root, profile(tmp_path), smi_xml, "--output-dir", str(out_dir)))
    assert code == 2 and "--output-dir goes with --check" in err


def test_join_logs_the_real_path_under_the_root(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    code, _, err = run_join(join_args(node_root, profile(tmp_path), smi_xml))
    assert code == 0
    wrote = sorted(line.removeprefix("wrote ") for line in err.splitlines() if line.startswith("wrote "))
    assert f"{node_root}/etc/containerd/config.toml" in wrote and len(wrote) == 6
    assert all(Path(p).is_file() and Path(p).is_relative_to(node_root) for p in wrote)
    # the node operation log names each file written (node paths, never content: no token)
    logged = (node_root / "var/log/nodeprep.log").read_text()
    assert sorted(ln.split("]: wrote ", 1)[1] for ln in logged.splitlines()) == sorted(
        p.removeprefix(str(node_root)) for p in wrote)
    assert TOKEN.split(".")[1] not in logged


def test_gpu_warning_is_printed_once(node_root: Path, tmp_path: Path) -> None:
    """No capture, no sysfs under the root: the GPU fact chain finds nothing and says so once."""
    args = ["join", "--profile", str(profile(tmp_path)), "--root", str(node_root), "--skip-preflight",
            "--skip-discovery", "--check"]
    code, _, err = run_join(args)
    assert code == 0, err
    assert err.count("gpu: no source available") == 1
    assert len(err.splitlines()) == len(set(err.splitlines()))  # no line printed twice


def test_kernel_label_is_the_roots_kernel(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    """Under --root the label is the root's target kernel, never this machine's running kernel:
    the newest kernel the active driver has modules for, else the newest installed kernel, else
    none; the profile's driver.kernel wins."""
    prof = parse_profile(yaml.safe_load(profile(tmp_path).read_text()), "node.yaml")
    running = os.uname().release

    def label(p=prof) -> str | None:  # type: ignore[no-untyped-def]
        plan = plan_join(p, JoinOptions(root=node_root, skip_preflight=True, nvidia_smi_xml=smi_xml))
        return {**plan.labels, **plan.api_labels}.get("nodeprep.dev/kernel")

    assert root_kernel(node_root) is None and label() is None
    for release in ("6.1.0-9-amd64", "6.1.0-28-amd64", "6.1.0-101-amd64"):
        (node_root / "lib/modules" / release / "kernel").mkdir(parents=True)
    (node_root / "lib/modules/6.1.0-999-amd64").mkdir()  # leftover directory, no kernel in it
    assert label() == "6.1.0-101-amd64" != running
    (node_root / "opt/nvidia/current/modules/6.1.0-28-amd64").mkdir(parents=True)
    assert label() == "6.1.0-28-amd64"
    pinned = parse_profile({**yaml.safe_load(profile(tmp_path).read_text()),
                            "driver": {"version": "535.309.01", "kernel": "6.1.0-9-amd64"}}, "node.yaml")
    assert label(pinned) == "6.1.0-9-amd64"


def test_dry_run_on_the_live_system_writes_nothing(tmp_path: Path) -> None:
    """`join --dry-run` without --root, run in a private mount namespace whose / is remounted
    read-only: any write to /etc (containerd, kubeadm config) would fail the command. The same
    command without --dry-run fails there, which shows the check can fail."""
    if os.geteuid() != 0:
        pytest.skip("needs root for a private mount namespace")
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    prof = profile(tmp_path, token_file=str(token))
    data = yaml.safe_load(prof.read_text())
    prof.write_text(yaml.safe_dump({**data, "runtime": {"cdi": False}}))  # no driver on this machine
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace here: {probe.stderr.decode().strip()}")
    cmd = [sys.executable, "-c", "from nodeprep.cli import main; main()", "join", "--profile", str(prof),
           "--skip-preflight", "--skip-discovery"]
    script = 'mount -o remount,bind,ro / && exec "$@"'
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}

    def in_ro_namespace(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *cmd,
                               *extra], capture_output=True, text=True, env=env, timeout=120)

    dry = in_ro_namespace("--check")
    assert dry.returncode == 0, dry.stderr
    assert "# ---- /etc/containerd/conf.d/99-nodeprep-nvidia.toml" in dry.stdout
    assert "# ---- /etc/nodeprep/kubeadm-join.yaml (mode 0600" in dry.stdout
    assert "not writable" not in dry.stderr and "wrote " not in dry.stderr
    real = in_ro_namespace()
    # the real run is stopped by the read-only /etc before it writes anything
    assert real.returncode == 2 and "/etc/containerd is not writable" in real.stderr, real.stderr
