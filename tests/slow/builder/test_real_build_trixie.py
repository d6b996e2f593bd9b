"""A real build for Debian 13: the open modules of 550.163.01 for a trixie 6.12 kernel, compiled in
the trixie build root with its gcc-14 (one compile per test cache: tests/support/realbuild.py
CELLS["debian13-open"]; later runs are input-digest hits). The kernel is 6.12.94+deb13-amd64, not
trixie's current default: 6.12.107 and later changed pci_resize_resource(), which 550.163.01's
nv-pci.c does not build against (a real finding of this test's first run)."""

from __future__ import annotations

import pytest

from nodeprep import artifact, runner

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trixie_open(test_cache):  # type: ignore[no-untyped-def]
    from tests.support.realbuild import ensure_cell

    return ensure_cell(test_cache, "debian13-open", userspace=True)


def test_open_modules_built_for_trixie_with_its_own_gcc14(trixie_open, tmp_path):
    manifest = artifact.extract(trixie_open.kmod, tmp_path)
    assert (manifest.os, manifest.flavour, manifest.driver_version) == ("debian-13", "open", "550.163.01")
    assert manifest.kernel_release == "6.12.94+deb13-amd64"
    # the compiler check passed against the compiler that built *this* kernel
    assert manifest.compiler.startswith("x86_64-linux-gnu-gcc-14 (Debian 14.")
    assert manifest.extra["build"]["build_compiler"].split()[-1] == manifest.compiler.split()[-1]
    assert manifest.extra["source"]["package"] == "nvidia-open-kernel-source"
    assert any(n.startswith("linux-kbuild-6.12.94+deb13_") for n in manifest.inputs)
    moddir = tmp_path / "modules" / manifest.kernel_release
    names = {p.name for p in moddir.iterdir()}
    assert {"nvidia.ko", "nvidia-uvm.ko", "nvidia-modeset.ko", "nvidia-drm.ko"} <= names
    ko = moddir / "nvidia.ko"
    assert runner.run(["modinfo", "-F", "vermagic", ko]).stdout.startswith("6.12.94+deb13-amd64 SMP ")
    assert runner.run(["modinfo", "-F", "version", ko]).stdout.strip() == "550.163.01"
    assert runner.run(["modinfo", "-F", "license", ko]).stdout.strip() == "Dual MIT/GPL"  # the open modules


def test_trixie_user_space_carries_the_supported_gpu_list(trixie_open, tmp_path):
    import json

    assert trixie_open.userspace is not None
    manifest = artifact.extract(trixie_open.userspace, tmp_path)
    assert manifest.extra["packages"]["nvidia-driver"] == "550.163.01-2"
    chips = json.loads((tmp_path / "share" / "supported-gpus.json").read_text())["chips"]
    assert any(c["devid"] == "0x2330" and "kernelopen" in c["features"] for c in chips)
