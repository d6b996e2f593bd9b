"""The GPUDirect companions' build-side decisions (nodeprep/builder/companionbuild.py,
nodeprep/sources/companions.py): nvidia.ko's exports as Module.symvers, the facts check of a built
companion, the tarballs' names and unpacking, and the request's refusals.

Nothing GPU-like is used. The modules under data/companions/ are real: gdrdrv.ko (gdrcopy 2.6) and
nvidia-fs.ko (gds-nvidia-fs 2.28.4) as build-driver compiled them here against Debian 12's 535.309.01
for 6.1.0-57-amd64 (stripped, unsigned); beside them the Module.symvers lines of that kernel for the
symbols they use, and what `symvers_of` derived from that build's nvidia.ko (65 MB, not recorded)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from nodeprep import targets
from nodeprep.builder.companionbuild import P2P_PREFIX, check_facts, p2p_header_dir, symvers_of
from nodeprep.builder.resolve import BuildRequest, validate_request
from nodeprep.builder.symvers import parse_symvers
from nodeprep.errors import ArtifactError, InputError
from nodeprep.modinfo import ModuleInfo, read_module
from nodeprep.sources import companions as sources
from tests.support import companions as shared
from tests.support.tarballs import write_tgz

DATA = Path(__file__).parent / "data" / "companions"
VERMAGIC = "6.1.0-57-amd64 SMP preempt mod_unload modversions "
KERNEL = parse_symvers((DATA / "linux-6.1.0-57-amd64.symvers").read_text())
NVIDIA_SYMVERS = (DATA / "nvidia-535.309.01-6.1.0-57-amd64.symvers").read_text()
SHA = "0" * 64


def nvidia_facts(symvers: str = NVIDIA_SYMVERS, vermagic: str = VERMAGIC) -> ModuleInfo:
    """nvidia.ko's loader facts as far as the companions see them: its exports and their CRCs."""
    exports = parse_symvers(symvers)
    return ModuleInfo(name="nvidia", modinfo={"vermagic": [vermagic]}, signed=False,
                       exports=sorted(exports), export_crcs={s: e.crc for s, e in exports.items()})


@pytest.mark.parametrize("ko", ["gdrdrv.ko", "nvidia-fs.ko"])
def test_the_built_companions_fit_nvidia_and_the_kernel(ko: str) -> None:
    facts = read_module(DATA / ko)
    assert facts.depends == ["nvidia"] and facts.release == "6.1.0-57-amd64"
    p2p = [s for s in facts.undefined if s.startswith(P2P_PREFIX)]
    assert "nvidia_p2p_get_pages" in p2p and all(s in facts.versions for s in p2p)
    assert check_facts(facts.name, facts, nvidia_facts(), KERNEL) == []


def test_a_companion_built_against_another_nvidia_is_refused() -> None:
    facts = read_module(DATA / "gdrdrv.ko")
    crc = parse_symvers(NVIDIA_SYMVERS)["nvidia_p2p_get_pages"].crc
    sym = "\tnvidia_p2p_get_pages\t"
    other = NVIDIA_SYMVERS.replace(f"0x{crc:08x}{sym}", f"0x12345678{sym}")
    problems = check_facts("gdrdrv", facts, nvidia_facts(other), KERNEL)
    assert problems == [f"gdrdrv: disagrees about version of symbol nvidia_p2p_get_pages "
                        f"(module 0x{crc:08x}, nvidia 0x12345678)"]
    problems = check_facts("gdrdrv", facts, nvidia_facts(vermagic="6.1.0-56-amd64 SMP preempt mod_unload "
                                                                  "modversions "), KERNEL)
    assert problems[0].startswith("gdrdrv: vermagic '6.1.0-57-amd64") and "6.1.0-56-amd64" in problems[0]
    lacking = "".join(x for x in NVIDIA_SYMVERS.splitlines(True) if "nvidia_p2p_put_pages\t" not in x)
    assert check_facts("gdrdrv", facts, nvidia_facts(lacking), KERNEL) == [
        "gdrdrv: Unknown symbol nvidia_p2p_put_pages"]


def test_a_companion_that_does_not_depend_on_nvidia_is_refused() -> None:
    facts = read_module(DATA / "gdrdrv.ko")
    alone = replace(facts, modinfo={**facts.modinfo, "depends": [""]})
    assert check_facts("gdrdrv", alone, nvidia_facts(), KERNEL)[0] == (
        "gdrdrv: depends on nothing, not nvidia "
        "(its nvidia_p2p_* symbols were not resolved against nvidia.ko)")


def test_symvers_of_writes_what_modpost_writes_and_reads_back() -> None:
    facts = nvidia_facts()
    text = symvers_of(facts, "nvidia")
    assert text == NVIDIA_SYMVERS
    assert all(line.endswith("\tnvidia\tEXPORT_SYMBOL\t") for line in text.splitlines())
    assert {s: e.crc for s, e in parse_symvers(text).items()} == facts.export_crcs


def test_export_crcs_of_real_kernel_modules_equal_the_kernels_module_symvers(test_cache: Path) -> None:
    """modinfo' CRC of each export (the __crc_ symbols modpost reads) against the kernel's own
    Module.symvers, on real Debian modules of the test cache's kernels (fetched by the smoke tier)."""
    kernels = sorted(p for p in (test_cache / "kernels").glob("*/Module.symvers"))
    if not kernels:
        pytest.skip("no kernels in the test cache (the slow smoke tier fetches them)")
    symvers = parse_symvers(kernels[0].read_text())
    tree = kernels[0].parent / "lib" / "modules"
    checked = 0
    for rel in ("kernel/drivers/gpu/drm/drm.ko", "kernel/drivers/infiniband/core/ib_core.ko"):
        found = sorted(tree.glob(f"*/{rel}*"))
        if not found:
            continue
        facts = read_module(found[0])
        assert facts.exports and set(facts.export_crcs) == set(facts.exports)
        for sym, crc in facts.export_crcs.items():
            assert symvers[sym].crc == crc, sym
            assert symvers[sym].gpl_only == (sym in facts.gpl_exports), sym
        checked += 1
    assert checked, f"no drm.ko or ib_core.ko under {tree}"


def test_the_p2p_header_of_each_tree_layout(tmp_path: Path) -> None:
    for rel in ("nvidia/nv-p2p.h", "kernel-open/nvidia/nv-p2p.h"):
        tree = tmp_path / rel.split("/")[0] / "tree"
        (tree / rel).parent.mkdir(parents=True)
        (tree / rel).write_text("")
        (tree / "common" / "inc").mkdir(parents=True)
        assert p2p_header_dir(tree) == (tree / rel).parent
    with pytest.raises(InputError, match="no nv-p2p.h"):
        p2p_header_dir(tmp_path / "empty")


def test_tarball_names() -> None:
    gdr, nvfs = sources.COMPANIONS["gdrdrv"], sources.COMPANIONS["nvidia-fs"]
    assert sources.check_name(gdr, "https://example.invalid/x/gdrcopy-2.6.tar.gz") == "2.6"
    assert sources.check_name(nvfs, "/srv/gds-nvidia-fs-2.28.4.tar.gz") == "2.28.4"
    with pytest.raises(InputError, match="--gdrcopy: gds-nvidia-fs-2.28.4.tar.gz is not a gdrcopy-<version>"):
        sources.check_name(gdr, "gds-nvidia-fs-2.28.4.tar.gz")


def test_hostile_tarballs_are_refused(tmp_path: Path) -> None:
    gdr = sources.COMPANIONS["gdrdrv"]
    link = write_tgz(tmp_path / "gdrcopy-2.6.tar.gz", [("gdrcopy-2.6/", None, None),
                                                    ("gdrcopy-2.6/src/gdrdrv/Makefile", None, "/etc/passwd")])
    with pytest.raises(ArtifactError, match="is not a file or directory"):
        sources.extract(gdr, link, tmp_path / "a")
    (tmp_path / "b").mkdir()
    other = write_tgz(tmp_path / "b" / "gdrcopy-2.6.tar.gz", [("gdrcopy-2.5/src/gdrdrv/Makefile", b"", None)])
    with pytest.raises(InputError, match="top directory 'gdrcopy-2.5' is not gdrcopy-2.6"):
        sources.extract(gdr, other, tmp_path / "c")
    (tmp_path / "d").mkdir()
    outside = write_tgz(tmp_path / "d" / "gdrcopy-2.6.tar.gz", [("gdrcopy-2.6/../x", b"", None)])
    with pytest.raises(ArtifactError):
        sources.extract(gdr, outside, tmp_path / "e")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("name, project", [("gdrcopy-2.6.tar.gz", "gdrdrv"),
                                           ("gds-nvidia-fs-2.28.4.tar.gz", "nvidia-fs")])
def test_the_shared_tarballs_unpack_to_their_kbuild_directory(tmp_path: Path, name: str,
                                                              project: str) -> None:
    path = shared.archive(name)
    if isinstance(path, str):
        pytest.skip(path)
    kdir = sources.extract(sources.COMPANIONS[project], path, tmp_path / project)
    assert (kdir / "Makefile").is_file()
    assert kdir == tmp_path / project / sources.COMPANIONS[project].subdir


@pytest.mark.parametrize("companions, builder, message", [
    ((("peermem", "x.tar.gz", SHA),), "chroot", "companion 'peermem' is not one of nvidia-fs, gdrdrv"),
    ((("gdrdrv", "gdrcopy-2.6.tar.gz", "abc"),), "chroot", "--gdrcopy-sha256: 'abc' is not a sha256"),
    ((("gdrdrv", "gdrcopy-2.6.tar.gz", SHA),) * 2, "chroot", "--gdrcopy: given twice"),
    ((("nvidia-fs", "gdrcopy-2.6.tar.gz", SHA),), "chroot",
     "--nvidia-fs: gdrcopy-2.6.tar.gz is not a gds-nvidia-fs"),
    ((("gdrdrv", "gdrcopy-2.6.tar.gz", SHA),), "host",
     "--gdrcopy: the GPUDirect modules are built in the build root"),
])
def test_bad_companion_requests_are_refused(companions: tuple[tuple[str, str, str], ...], builder: str,
                                            message: str) -> None:
    req = BuildRequest(target=targets.get("debian-12"), companions=companions, builder=builder)
    with pytest.raises(InputError) as e:
        validate_request(req)
    assert str(e.value).startswith(message), str(e.value)
