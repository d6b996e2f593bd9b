"""The initramfs pieces: newc writer (checked with cpio(1)), modules.dep, load order, /init."""

from __future__ import annotations

import gzip
import io
import os
import stat
from pathlib import Path

import pytest

from nodeprep import runner
from nodeprep.builder import initramfs
from nodeprep.builder.initramfs import CpioEntry
from nodeprep.errors import InputError
from nodeprep.modinfo import module_bytes

needs_cpio = pytest.mark.skipif(runner.which("cpio") is None,
                                reason="cpio(1) not installed (scripts/deps/smoke.apt)")


def _entries() -> list[CpioEntry]:
    return [
        CpioEntry.dir("bin"),
        CpioEntry.file("bin/tool", b"#!/bin/sh\necho hi\n", 0o755),
        CpioEntry.symlink("bin/sh", "tool"),
        CpioEntry.dir("modules"),
        CpioEntry.file("modules/odd-size.ko", bytes(range(256)) * 3 + b"xyz"),  # not a multiple of 4
        CpioEntry.file("empty", b""),
    ]


@needs_cpio
def test_newc_archive_lists_and_extracts_with_cpio(tmp_path: Path) -> None:
    buf = io.BytesIO()
    size = initramfs.write_newc(_entries(), buf)
    data = buf.getvalue()
    assert size == len(data) and size % 512 == 0
    archive = tmp_path / "a.cpio"
    archive.write_bytes(data)
    listing = runner.run(["cpio", "-t", "-F", archive]).stdout.split()
    assert listing == ["bin", "bin/tool", "bin/sh", "modules", "modules/odd-size.ko", "empty"]
    out = tmp_path / "out"
    out.mkdir()
    runner.run(["cpio", "-i", "-d", "--quiet", "-F", archive], cwd=out)
    assert (out / "bin/tool").read_bytes() == b"#!/bin/sh\necho hi\n"
    assert stat.S_IMODE((out / "bin/tool").stat().st_mode) == 0o755
    assert os.readlink(out / "bin/sh") == "tool"
    assert (out / "modules/odd-size.ko").read_bytes() == bytes(range(256)) * 3 + b"xyz"
    assert (out / "empty").read_bytes() == b""
    assert (out / "modules").is_dir()


@needs_cpio
def test_build_initramfs_gzip_is_readable_by_cpio(tmp_path: Path, data: Path) -> None:
    busybox = tmp_path / "busybox"
    busybox.write_bytes(b"\x7fELF not really busybox")
    image = initramfs.build_initramfs(tmp_path / "img", busybox, "#!/bin/busybox sh\n",
                                      {"vgem.ko": data / "vgem.ko"}, compress=True)
    raw = gzip.decompress(image.read_bytes())
    plain = tmp_path / "plain.cpio"
    plain.write_bytes(raw)
    names = runner.run(["cpio", "-t", "-F", plain]).stdout.split()
    assert {"init", "bin/busybox", "bin/sh", "modules/vgem.ko"} <= set(names)
    out = tmp_path / "out"
    out.mkdir()
    runner.run(["cpio", "-i", "-d", "--quiet", "-F", plain], cwd=out)
    assert (out / "modules/vgem.ko").read_bytes() == (data / "vgem.ko").read_bytes()
    assert os.access(out / "init", os.X_OK)


def test_same_input_same_image(tmp_path: Path, data: Path) -> None:
    busybox = tmp_path / "busybox"
    busybox.write_bytes(b"bb")
    mods = {"vgem.ko": data / "vgem.ko"}
    a = initramfs.build_initramfs(tmp_path / "a", busybox, "init", mods, compress=True)
    b = initramfs.build_initramfs(tmp_path / "b", busybox, "init", mods, compress=True)
    assert a.read_bytes() == b.read_bytes()


def test_compressed_modules_are_unpacked(tmp_path: Path, data: Path) -> None:
    import lzma

    src = tmp_path / "vgem.ko.xz"
    src.write_bytes(lzma.compress((data / "vgem.ko").read_bytes()))
    assert module_bytes(src) == (data / "vgem.ko").read_bytes()


def test_modules_dep_parsing(data: Path) -> None:
    dep = initramfs.parse_modules_dep((data / "modules.dep.6.1.0-56-amd64.subset").read_text())
    assert dep["vgem"] == ("kernel/drivers/gpu/drm/vgem/vgem.ko", ["drm_shmem_helper", "drm"])
    assert dep["nvme_core"][0] == "kernel/drivers/nvme/host/nvme-core.ko"  # '-' -> '_' in module names
    assert dep["drm"] == ("kernel/drivers/gpu/drm/drm.ko", [])
    with pytest.raises(InputError, match="line 1"):
        initramfs.parse_modules_dep("kernel/foo.ko kernel/bar.ko\n")


def test_load_order_puts_dependencies_first(data: Path) -> None:
    dep = initramfs.parse_modules_dep((data / "modules.dep.6.1.0-56-amd64.subset").read_text())
    # nvidia-drm's modinfo: depends=drm,drm_kms_helper,nvidia-modeset; nvidia-modeset: nvidia,video
    wanted = {"nvidia": [], "nvidia_modeset": ["nvidia", "video"], "nvidia_drm": ["drm", "drm_kms_helper",
                                                                              "nvidia-modeset"]}
    order = initramfs.load_order(wanted, dep)
    assert set(order) == {"nvidia", "nvidia_modeset", "nvidia_drm", "drm", "drm_kms_helper", "video", "wmi"}
    for before, after in [("wmi", "video"), ("video", "nvidia_modeset"), ("nvidia", "nvidia_modeset"),
                          ("drm", "drm_kms_helper"), ("drm_kms_helper", "nvidia_drm"),
                          ("nvidia_modeset", "nvidia_drm")]:
        assert order.index(before) < order.index(after), (before, after, order)


def test_load_order_skips_builtin_and_rejects_unknown(data: Path) -> None:
    dep = initramfs.parse_modules_dep((data / "modules.dep.6.1.0-56-amd64.subset").read_text())
    order = initramfs.load_order({"vgem": ["drm", "drm_shmem_helper"]}, dep,
                                 builtin=["kernel/drivers/gpu/drm/drm.ko"])
    assert order == ["drm_shmem_helper", "vgem"]
    with pytest.raises(InputError, match="module no_such_mod .needed by x. is neither"):
        initramfs.load_order({"x": ["no_such_mod"]}, dep)
    with pytest.raises(InputError, match="cycle"):
        initramfs.load_order({"a": ["b"], "b": ["a"]}, dep)


def test_init_script_loads_in_order_and_is_valid_sh(tmp_path: Path) -> None:
    steps = initramfs.InitSteps(load=["drm", "nvidia"], files={"drm": "drm.ko", "nvidia": "nvidia.ko"},
                                stop_after=["drm"])
    script = initramfs.render_init(steps)
    assert script.startswith("#!/bin/busybox sh\n")
    assert script.index("insmod /modules/drm.ko") < script.index("insmod /modules/nvidia.ko")
    assert "module.sig_enforce" not in script
    path = tmp_path / "init"
    path.write_text(script)
    runner.run(["sh", "-n", path])  # syntax check by a real shell
