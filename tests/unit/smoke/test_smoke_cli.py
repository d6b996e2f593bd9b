"""`nodeprep smoke-test` input handling (the real boots are in tests/slow/smoke/): every refusal is one
line on stderr with exit status 2, before anything is downloaded or booted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from nodeprep import runner
from nodeprep.artifact import Manifest, pack
from nodeprep.builder.secureboot import pe_signature
from nodeprep.errors import ArtifactError

REPO = Path(__file__).resolve().parents[3]


def nodeprep(*args: object) -> runner.Result:
    return runner.run([sys.executable, "-m", "nodeprep.cli", *args], check=False,
                      env={"PYTHONPATH": str(REPO)})


def _kmod(tmp_path: Path, data: Path, kind: str = "kmod") -> Path:
    payload = tmp_path / "payload"
    if kind == "kmod":
        (payload / "modules" / "6.1.0-56-amd64").mkdir(parents=True)
        (payload / "modules" / "6.1.0-56-amd64" / "nvidia-peermem.ko").write_bytes(
            (data / "nvidia-peermem.ko").read_bytes())
        m = Manifest(kind="kmod", driver_version="535.309.01", arch="amd64", os="debian-12",
                     input_digest="0" * 64, inputs={}, flavour="proprietary", kernel_release="6.1.0-56-amd64")
    else:
        (payload / "lib64").mkdir(parents=True)
        (payload / "lib64" / "libx.so").write_bytes(b"x")
        m = Manifest(kind="userspace", driver_version="535.309.01", arch="amd64", os="debian-12",
                     input_digest="0" * 64, inputs={})
    path, _ = pack(payload, m, tmp_path / "store")
    return path


def test_help() -> None:
    res = nodeprep("smoke-test", "--help")
    assert res.returncode == 0
    for opt in ("--cache", "--sig-enforce", "--trust-cert", "--timeout", "--json", "--kernel", "--force"):
        assert opt in res.stdout


def test_missing_artifact(tmp_path: Path) -> None:
    res = nodeprep("smoke-test", tmp_path / "nope.tar.zst", "--cache", tmp_path / "c")
    assert res.returncode == 2
    assert res.stderr.strip() == f"error: {tmp_path / 'nope.tar.zst'}: no such artifact"


def test_userspace_artifact_is_refused(tmp_path: Path, data: Path) -> None:
    art = _kmod(tmp_path, data, kind="userspace")
    res = nodeprep("smoke-test", art, "--cache", tmp_path / "c")
    assert res.returncode == 2
    assert "not a kmod artifact (kind userspace)" in res.stderr
    assert "Traceback" not in res.stderr


def test_other_kernel_needs_force(tmp_path: Path, data: Path) -> None:
    art = _kmod(tmp_path, data)
    res = nodeprep("smoke-test", art, "--cache", tmp_path / "c", "--kernel", "6.1.0-47-amd64")
    assert res.returncode == 2
    assert "built for kernel 6.1.0-56-amd64, not 6.1.0-47-amd64 (add --force" in res.stderr
    assert not (tmp_path / "c" / "kernels").exists()  # nothing fetched


def test_bad_kernel_release_is_refused(tmp_path: Path, data: Path) -> None:
    art = _kmod(tmp_path, data)
    res = nodeprep("smoke-test", art, "--cache", tmp_path / "c", "--kernel", "../../etc", "--force")
    assert res.returncode == 2
    assert "invalid kernel release '../../etc'" in res.stderr


def test_pe_signature_needs_a_signed_pe(data: Path) -> None:
    with pytest.raises(ArtifactError, match="no usable Authenticode signature"):
        pe_signature((data / "vgem.ko").read_bytes())
