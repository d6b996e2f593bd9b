"""Fabric Manager from NVIDIA's archive: an archive packed in its real layout around stand-in binaries
(tests/support/fmarchive.py: no real archive is reachable here), read by the builder's rules; the
version refusals of build-driver (one line, exit 2, nothing written). No GPU involved."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from nodeprep.builder import fabricmanager
from nodeprep.errors import ArtifactError, InputError
from tests.support import fmarchive
from tests.support.clirunner import invoke

VERSION = "535.309.01"
SHA = "ab" * 32


def read(path: Path, driver: str = VERSION) -> fabricmanager.FabricManager:
    return fabricmanager.read_archive(path, hashlib.sha256(path.read_bytes()).hexdigest(), driver, "amd64")


def test_what_a_node_runs_is_taken_and_the_config_points_into_the_active_root(tmp_path: Path) -> None:
    fm = read(fmarchive.pack(tmp_path, VERSION))
    assert sorted(fm.files) == [
        "bin/nv-fabricmanager", "bin/nvswitch-audit", "lib64/libnvfm.so.1",
        "share/nvidia/nvswitch/dgxa100_hgxa100_topology", "share/nvidia/nvswitch/dgxh100_hgxh100_topology",
        "share/nvidia/nvswitch/dgxh800_hgxh800_topology", "share/nvidia/nvswitch/fabricmanager.cfg"]
    cfg = fm.files["share/nvidia/nvswitch/fabricmanager.cfg"][0].decode()
    assert "TOPOLOGY_FILE_PATH=/opt/nvidia/current/share/nvidia/nvswitch\n" in cfg
    assert "DATABASE_PATH=/opt/nvidia/current/share/nvidia/nvswitch\n" in cfg
    assert "/usr/share/nvidia/nvswitch" not in cfg and "FM_CMD_PORT_NUMBER=6666\n" in cfg
    assert fm.files["bin/nv-fabricmanager"][1] == 0o755 and fm.record()["version"] == VERSION
    payload = tmp_path / "payload"
    contents: dict[str, list[str]] = {"bin": ["nvidia-smi"]}
    fabricmanager.place(fm, payload, contents)
    assert (payload / "bin/nv-fabricmanager").read_bytes()[:4] == b"\x7fELF"
    assert contents["bin"] == ["nvidia-smi", "nv-fabricmanager", "nvswitch-audit"]


def test_another_version_is_refused_with_one_line_naming_both(tmp_path: Path) -> None:
    """The driver-container bug of gpu-driver-container #735: Fabric Manager 590.48.01 beside driver
    580.126.09."""
    path = fmarchive.pack(tmp_path, "590.48.01")
    with pytest.raises(InputError) as e:
        read(path, "580.126.09")
    assert str(e.value) == ("--fabricmanager: fabricmanager-linux-x86_64-590.48.01-archive.tar.xz is "
                            "Fabric Manager 590.48.01, the driver is 580.126.09: Fabric Manager must be the "
                            "driver's exact version")


def test_a_top_directory_of_another_version_is_refused(tmp_path: Path) -> None:
    path = fmarchive.pack(tmp_path, VERSION, top="fabricmanager-linux-x86_64-590.48.01-archive")
    with pytest.raises(ArtifactError, match="is outside the top directory"):
        read(path)


def test_a_library_with_another_soname_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="libnvfm.so.1 has SONAME libnvfm.so.2, not libnvfm.so.1"):
        read(fmarchive.pack(tmp_path, VERSION, soname="libnvfm.so.2"))


def test_a_program_that_is_no_elf_object_is_refused(tmp_path: Path) -> None:
    other = fmarchive.pack(tmp_path, VERSION, extra={"bin/nv-fabricmanager": b"#!/bin/sh\n"})
    with pytest.raises(ArtifactError, match="nv-fabricmanager is not an ELF object"):
        read(other)


def test_the_arch_must_be_the_builds(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is for sbsa, the build is for amd64"):
        fabricmanager.check_name(f"fabricmanager-linux-sbsa-{VERSION}-archive.tar.xz", VERSION, "amd64")
    with pytest.raises(InputError, match="is not named fabricmanager-linux-<arch>-<version>-archive.tar.xz"):
        fabricmanager.check_name("fabricmanager.tar.xz", VERSION, "amd64")


FM_URL = f"http://127.0.0.1:9/fabricmanager-linux-x86_64-{VERSION}-archive.tar.xz"


@pytest.mark.parametrize("args, message", [
    (["--fabricmanager-sha256", SHA], "error: --fabricmanager-sha256 is only used with --fabricmanager"),
    (["--fabricmanager", FM_URL],
     "error: --fabricmanager needs --fabricmanager-sha256 (the archive's sha256)"),
    (["--fabricmanager", FM_URL, "--fabricmanager-sha256", SHA, "--no-userspace"],
     "error: --fabricmanager goes into the user-space artifact: not with --no-userspace"),
    # the name carries the version: refused before anything is downloaded (port 9 answers nothing)
    (["--fabricmanager", FM_URL, "--fabricmanager-sha256", SHA, "--driver", "580.142"],
     f"error: --fabricmanager: fabricmanager-linux-x86_64-{VERSION}-archive.tar.xz is Fabric Manager "
     f"{VERSION}, the driver is 580.142: Fabric Manager must be the driver's exact version"),
    (["--fabricmanager", FM_URL, "--fabricmanager-sha256", SHA,
      "--runfile", "http://127.0.0.1:9/NVIDIA-Linux-x86_64-580.142.run", "--sha256", "cd" * 32],
     f"error: --fabricmanager: fabricmanager-linux-x86_64-{VERSION}-archive.tar.xz is Fabric Manager "
     f"{VERSION}, the driver is 580.142: Fabric Manager must be the driver's exact version"),
])
def test_bad_fabricmanager_input(tmp_path: Path, args: list[str], message: str) -> None:
    store, cache = tmp_path / "store", tmp_path / "cache"
    res = invoke("build-driver", "--store", str(store), "--cache", str(cache), "--no-smoke-test", *args)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert lines[0] == message and "Traceback" not in res.output
    assert not store.exists()
