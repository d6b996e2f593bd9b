"""A real build for Debian 13: trixie's datacenter branch (nvidia-tesla-535, 535.274.02) for its
newest kernel, compiled in the trixie build root with its gcc-14 (one compile per test cache:
tests/support/realbuild.py CELLS["debian13-tesla"]; later runs are input-digest hits). Not
trixie's 550.163.01: it builds for no kernel trixie still serves (6.12.107 and later changed
pci_resize_resource(); 6.12.94, the newest it built against, has left the archive), which
test_matrix_expand.py checks against the real archive."""

from __future__ import annotations

import json

import pytest

from nodeprep import artifact, runner

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trixie(test_cache):  # type: ignore[no-untyped-def]
    from tests.support.realbuild import ensure_cell

    return ensure_cell(test_cache, "debian13-tesla", userspace=True)


def test_tesla_modules_built_for_trixie_with_its_own_gcc14(trixie, tmp_path):
    manifest = artifact.extract(trixie.kmod, tmp_path)
    assert (manifest.os, manifest.flavour) == ("debian-13", "proprietary")
    assert manifest.driver_version == "535.274.02"
    assert manifest.kernel_release == "6.12.117+deb13-amd64"
    # the compiler check passed against the compiler that built *this* kernel
    assert manifest.compiler.startswith("x86_64-linux-gnu-gcc-14 (Debian 14.")
    assert manifest.extra["build"]["build_compiler"].split()[-1] == manifest.compiler.split()[-1]
    assert manifest.extra["source"]["package"] == "nvidia-tesla-535-kernel-source"
    assert manifest.extra["source"]["version"].endswith("~deb13u1")  # trixie's own package
    assert any(n.startswith("linux-kbuild-6.12.117+deb13_") for n in manifest.inputs)
    moddir = tmp_path / "modules" / manifest.kernel_release
    names = {p.name for p in moddir.iterdir()}
    assert {"nvidia.ko", "nvidia-uvm.ko", "nvidia-modeset.ko", "nvidia-drm.ko"} <= names
    ko = moddir / "nvidia.ko"
    assert runner.run(["modinfo", "-F", "vermagic", ko]).stdout.startswith("6.12.117+deb13-amd64 SMP ")
    assert runner.run(["modinfo", "-F", "version", ko]).stdout.strip() == "535.274.02"
    assert runner.run(["modinfo", "-F", "license", ko]).stdout.strip() == "NVIDIA"  # proprietary


def test_trixie_tesla_user_space_carries_the_supported_gpu_list(trixie, tmp_path):
    assert trixie.userspace is not None
    manifest = artifact.extract(trixie.userspace, tmp_path)
    packages = manifest.extra["packages"]
    assert packages["nvidia-tesla-535-driver"] == "535.274.02-1~deb13u1"
    assert packages["libnvidia-tesla-535-cuda1"] == "535.274.02-1~deb13u1"
    assert "nvidia-driver" not in packages  # the tesla family's packages, not trixie's 550 ones
    chips = json.loads((tmp_path / "share" / "supported-gpus.json").read_text())["chips"]
    assert any(c["devid"] == "0x2330" and c["name"] == "NVIDIA H100 80GB HBM3" for c in chips)
