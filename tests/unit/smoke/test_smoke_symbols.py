"""ELF reading of real kernel modules and the static symbol check against real Module.symvers lines
(recorded subsets of Debian's linux-headers; see data/README.md)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from nodeprep.builder.smoke import split_boot_static, vermagic_mismatch
from nodeprep.builder.symvers import check_symbols, parse_symvers
from nodeprep.errors import ArtifactError, InputError
from nodeprep.modinfo import ModuleInfo, parse_module, read_module


@pytest.fixture(scope="module")
def symvers56(data: Path):  # type: ignore[no-untyped-def]
    return parse_symvers((data / "Module.symvers.6.1.0-56-amd64.subset").read_text())


@pytest.fixture(scope="module")
def symvers50(data: Path):  # type: ignore[no-untyped-def]
    return parse_symvers((data / "Module.symvers.6.1.0-50-amd64.subset").read_text())


def test_read_in_tree_module(data: Path) -> None:
    vgem = read_module(data / "vgem.ko")
    assert vgem.name == "vgem"
    assert vgem.vermagic == "6.1.0-56-amd64 SMP preempt mod_unload modversions "
    assert sorted(vgem.depends) == ["drm", "drm_shmem_helper"]
    assert vgem.field("license") == "GPL and additional rights" and vgem.gpl_compatible
    assert vgem.signed
    assert "drm_gem_shmem_dumb_create" in vgem.undefined and "__fentry__" in vgem.undefined
    assert "vgem_init" not in vgem.undefined  # defined locally
    assert "module_layout" in vgem.versions


def test_read_nvidia_module(data: Path) -> None:
    peermem = read_module(data / "nvidia-peermem.ko")
    assert peermem.name == "nvidia_peermem"
    assert not peermem.signed
    assert peermem.field("license") == "Linux-OpenIB" and not peermem.gpl_compatible
    assert peermem.undefined == ["__fentry__", "__x86_return_thunk", "_printk", "param_ops_int"]
    assert peermem.versions["param_ops_int"] == 0x69E0FBDC


def test_garbage_is_not_a_module() -> None:
    with pytest.raises(ArtifactError, match="x.ko: not a valid kernel module"):
        parse_module(b"\x7fELF\x02\x01" + b"\0" * 10, "x.ko")
    with pytest.raises(ArtifactError, match="not an ELF file"):
        parse_module(b"MZ" + b"\0" * 100, "y.ko")


def test_symbols_resolve_on_own_kernel(data: Path, symvers56) -> None:  # type: ignore[no-untyped-def]
    assert check_symbols(read_module(data / "nvidia-peermem.ko"), symvers56) == []
    assert check_symbols(read_module(data / "vgem.ko"), symvers56) == []


def test_crc_mismatch_on_other_kernel(data: Path, symvers50) -> None:  # type: ignore[no-untyped-def]
    problems = check_symbols(read_module(data / "nvidia-peermem.ko"), symvers50)
    assert problems == [
        "nvidia_peermem: disagrees about version of symbol module_layout "
        "(module 0x9060323f, kernel 0xbce1a965)",
        "nvidia_peermem: disagrees about version of symbol param_ops_int "
        "(module 0x69e0fbdc, kernel 0x7d675181)",
    ]


def test_missing_symbol_is_unknown(data: Path, symvers56) -> None:  # type: ignore[no-untyped-def]
    without = {k: v for k, v in symvers56.items() if k != "drm_gem_shmem_dumb_create"}
    problems = check_symbols(read_module(data / "vgem.ko"), without)
    assert problems == ["vgem: Unknown symbol drm_gem_shmem_dumb_create"]


def test_symbols_exported_by_a_sibling_module_resolve(data: Path, symvers56) -> None:  # type: ignore
    vgem = read_module(data / "vgem.ko")
    without = {k: v for k, v in symvers56.items() if k != "drm_gem_shmem_dumb_create"}
    provider = ModuleInfo(name="helper", modinfo={}, undefined=[], exports=["drm_gem_shmem_dumb_create"],
                           versions={}, signed=False)
    assert check_symbols(vgem, without, [provider]) == []


def test_gpl_only_symbols_need_a_gpl_licence(data: Path, symvers56) -> None:  # type: ignore[no-untyped-def]
    vgem = read_module(data / "vgem.ko")
    proprietary = replace(vgem, modinfo={**vgem.modinfo, "license": ["NVIDIA"]})
    problems = check_symbols(proprietary, symvers56)
    assert "vgem: uses GPL-only symbol devres_open_group with licence 'NVIDIA'" in problems
    assert all("GPL-only" in p for p in problems)


def test_symvers_parsing(symvers56) -> None:  # type: ignore[no-untyped-def]
    e = symvers56["param_ops_int"]
    assert (e.crc, e.module, e.gpl_only) == (0x69E0FBDC, "vmlinux", False)
    with pytest.raises(InputError, match="Module.symvers line 1"):
        parse_symvers("0x1234 only-two\n")


def test_only_nvidia_is_booted_when_present(data: Path) -> None:
    peermem = read_module(data / "nvidia-peermem.ko")
    nvidia = replace(peermem, name="nvidia", modinfo={"depends": [""]})
    uvm = replace(peermem, name="nvidia_uvm", modinfo={"depends": ["nvidia"]})
    assert split_boot_static({"nvidia": nvidia, "nvidia_uvm": uvm, "nvidia_peermem": peermem}) == \
        (["nvidia"], ["nvidia_peermem", "nvidia_uvm"])
    vgem = read_module(data / "vgem.ko")
    helper = replace(vgem, name="drm_shmem_helper", modinfo={"depends": ["drm"]})
    assert split_boot_static({"vgem": vgem, "drm_shmem_helper": helper}) == (["drm_shmem_helper"], ["vgem"])


def test_vermagic_release_must_match_the_kernel(data: Path) -> None:
    """6.1.0-55 and 6.1.0-56 (both 6.1.192) share every CRC, so the kernel itself loads a module built
    for the other one (seen in a real boot); the smoke test still refuses it by release."""
    mods = [read_module(data / "vgem.ko"), read_module(data / "nvidia-peermem.ko")]
    assert vermagic_mismatch(mods, "6.1.0-56-amd64") is None
    assert vermagic_mismatch(mods, "6.1.0-55-amd64") == "vermagic 6.1.0-56-amd64 of nvidia_peermem is not " \
        "kernel 6.1.0-55-amd64"
