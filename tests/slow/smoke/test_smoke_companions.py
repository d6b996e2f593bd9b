"""The GPUDirect companions through the driver's pipeline, for real (issue 39): nvidia-fs
(gds-nvidia-fs 2.28.4) and gdrdrv (gdrcopy 2.6) compiled by build-driver against the shared real
build's driver tree (Debian 12's proprietary 535 for Debian 12's current kernel: its nvidia/nv-p2p.h
is all they need, so the open 580.142 cell's tree is not used), in the shared build's build root
with its compiler, the driver itself a compile-cache hit (no second driver compile); signed with
the same throw-away key as the driver's modules; smoke-booted in qemu under UEFI Secure Boot with
that key enrolled before publishing.

No GPU: nvidia.ko loads up to its PCI probe and returns ENODEV, so the kernel never holds its
nvidia_p2p_* exports and nothing that binds to them can be insmodded; the smoke test checks the
companions after nvidia the way it checks nvidia-uvm and the others: every undefined symbol against
the kernel's Module.symvers and nvidia.ko's exports, CRCs included."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
import zstandard

from nodeprep.artifact import read_manifest
from nodeprep.modinfo import parse_module
from tests.support.realbuild import ensure_gpudirect_build

pytestmark = pytest.mark.slow


def _members(path: Path) -> dict[str, bytes]:
    with open(path, "rb") as f, zstandard.ZstdDecompressor().stream_reader(f) as raw, \
            tarfile.open(fileobj=raw, mode="r|") as tar:
        out = {}
        for m in tar:
            if m.isreg() and m.name.endswith(".ko"):
                data = tar.extractfile(m)
                assert data is not None
                out[m.name.rsplit("/", 1)[-1]] = data.read()
        return out


def test_companions_compile_against_the_shared_driver_and_pass_the_smoke_boot(
        test_cache: Path, signing_key: tuple[Path, Path]) -> None:
    try:
        result, made = ensure_gpudirect_build(test_cache, *signing_key)
    except RuntimeError as e:
        pytest.skip(str(e))
    assert not result.compiled, "the driver was compiled again: it must be the shared build's cache hit"
    m = read_manifest(result.artifact)
    kos = _members(result.artifact)
    assert {"nvidia.ko", "nvidia-fs.ko", "gdrdrv.ko"} <= set(kos)
    facts = {name: parse_module(data, name) for name, data in kos.items()}
    for name in ("nvidia-fs.ko", "gdrdrv.ko"):
        f = facts[name]
        assert f.vermagic.strip() == m.vermagic == facts["nvidia.ko"].vermagic.strip()
        assert f.depends == ["nvidia"] and f.signed
        p2p = [s for s in f.undefined if s.startswith("nvidia_p2p_")]
        assert p2p and all(f.versions[s] == facts["nvidia.ko"].export_crcs[s] for s in p2p), name
    assert facts["gdrdrv.ko"].version == "2.6" and facts["nvidia-fs.ko"].version == "2.28.4"
    signing = m.extra["signing"]
    assert {"nvidia-fs.ko", "gdrdrv.ko", "nvidia.ko"} <= {p.rsplit("/", 1)[-1] for p in signing["modules"]}
    smoke = m.extra["smoke_test"]
    assert smoke["verdict"] == "PASS" and smoke["secure_boot"], json.dumps(smoke, indent=1)
    assert smoke["modules"]["nvidia"] == "probe: no GPU (ENODEV)"
    for name in ("nvidia_fs", "gdrdrv"):
        assert smoke["modules"][name].startswith("symbols resolved (nvidia"), smoke["modules"]
    companions = m.extra["companions"]
    assert companions["modules"]["gdrdrv"]["depends"] == ["nvidia"]
    assert "nvidia_p2p_dma_map_pages" in companions["modules"]["nvidia-fs"]["p2p_symbols"]
    assert companions["sources"]["gdrdrv"]["name"] == "gdrcopy-2.6.tar.gz"
    if made is not None:  # this run compiled them: docs/build.md's measurement reads the record
        print(f"companions compiled in {made:.1f} s of make")
