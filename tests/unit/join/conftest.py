"""Fixtures for join tests: a node root with an installed driver made by the real artifact code.

The driver root is built the way a node gets it: a userspace payload of real shared objects
(compiled here with the real sonames libcuda.so.1, libnvidia-ml.so.1, ...), packed with
nodeprep.artifact.pack, extracted with nodeprep.artifact.extract into /opt/nvidia/<version>, soname
links made by `ldconfig -n`, and /opt/nvidia/current pointing at it. Only the library *contents*
stand in for NVIDIA's (no GPU here); names, sonames, manifest and layout are real.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from nodeprep import artifact, runner
from tests.support.fixtures import NVIDIA_SMI as FIXTURES

REPO = Path(__file__).resolve().parents[3]
VERSION = "535.309.01"
LIBS = {
    "libcuda.so": "libcuda.so.1",
    "libnvidia-ml.so": "libnvidia-ml.so.1",
    "libnvidia-ptxjitcompiler.so": "libnvidia-ptxjitcompiler.so.1",
}
BINS = (
    "nvidia-smi",
    "nvidia-modprobe",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
TOKEN = "k9x2mq.7f3a9c0d1e5b8a24"
CA_HASH = "sha256:" + "0f" * 32


def _compile_so(dest: Path, soname: str, work: Path) -> None:
    src = work / "lib.c"
    src.write_text(f"int nodeprep_test_symbol(void) {{ return {len(soname)}; }}\n")
    cc = runner.which("cc") or runner.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build test shared objects")
    runner.run([cc, "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", dest, src], timeout=60)


def build_payload(work: Path, version: str = VERSION) -> Path:
    payload = work / "payload"
    (payload / "lib64").mkdir(parents=True)
    (payload / "bin").mkdir()
    (payload / "firmware/nvidia" / version).mkdir(parents=True)
    for base, soname in LIBS.items():
        real = payload / "lib64" / f"{base}.{version}"
        _compile_so(real, soname, work)
    # the artifact carries the libcuda soname link; ldconfig -n makes the others on the node
    (payload / "lib64" / "libcuda.so.1").symlink_to(f"libcuda.so.{version}")
    for name in BINS:
        shutil.copy(Path("/bin/true"), payload / "bin" / name)
    (payload / "firmware/nvidia" / version / "gsp_ga10x.bin").write_bytes(os.urandom(256))
    return payload


def unpack_unactivated(root: Path, payload: Path, store: Path, version: str) -> Path:
    """A user space of `version` from `payload` unpacked beside the active one as install would,
    without install's checks (the tests then break it on purpose); returns its version root."""
    manifest = artifact.Manifest(kind="userspace", driver_version=version, arch="amd64", os="debian-12",
                                 input_digest="1" * 64, inputs={})
    path, _ = artifact.pack(payload, manifest, store)
    vdir = root / "opt/nvidia" / version
    vdir.mkdir()
    artifact.extract(path, vdir)
    runner.run(["ldconfig", "-n", vdir / "lib64"], timeout=60)
    return vdir


def install_driver(root: Path, work: Path, version: str = VERSION) -> Path:
    """Pack a userspace artifact and install it under root/opt/nvidia/<version>; returns the artifact."""
    manifest = artifact.Manifest(
        kind="userspace",
        driver_version=version,
        arch="amd64",
        os="debian-12",
        input_digest="0" * 64,
        inputs={},
    )
    path, _ = artifact.pack(build_payload(work, version), manifest, work / "store")
    dest = root / "opt/nvidia" / version
    dest.mkdir(parents=True)
    artifact.extract(path, dest)
    runner.run(["ldconfig", "-n", dest / "lib64"], timeout=60)
    current = root / "opt/nvidia/current"
    if current.is_symlink():
        current.unlink()
    current.symlink_to(version)
    node_python(root)
    return path


def node_python(root: Path, name: str = "python3.11") -> None:
    """The node's /usr/bin/python3 as Debian lays it out (a link to python3.N), which nodeprep's
    CDI hook program runs with; only its name is read here."""
    bindir = root / "usr/bin"
    bindir.mkdir(parents=True, exist_ok=True)
    if not (bindir / name).exists():
        shutil.copy(Path("/bin/true"), bindir / name)
    if not (bindir / "python3").is_symlink():
        (bindir / "python3").symlink_to(name)


def write_token(root: Path, mode: int = 0o600, token: str = TOKEN) -> Path:
    path = root / "etc/nodeprep/bootstrap-token"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(token + "\n")
    path.chmod(mode)
    return path


@pytest.fixture
def node_root(tmp_path: Path) -> Path:
    """A node root with an installed driver, a 0600 token file and containerd's real default config
    (`containerd config default` when containerd is installed)."""
    root = tmp_path / "root"
    root.mkdir()
    install_driver(root, tmp_path / "work")
    write_token(root)
    return root


@pytest.fixture
def smi_xml() -> Path:
    return FIXTURES / "dual-rtx-a5000_590.44.01.xml"


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)
