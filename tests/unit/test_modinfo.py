"""nodeprep.modinfo reads a kernel module's facts from its bytes: the same strings modinfo(8) prints
(compared on real Debian kernel modules, .ko and .ko.xz, from the test cache's kernels and the
recorded smoke data), compressed modules read like plain ones, and hostile bytes (truncated,
mutated, random, undecompressable, a FIFO or a link in place of the file) raise ElfError and
nothing else. The node reads the target kernel's vermagic with it (node/kmod.py)."""

from __future__ import annotations

import gzip
import lzma
import os
import random
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodeprep import modinfo, runner
from nodeprep.elf import ElfError
from nodeprep.errors import InputError
from nodeprep.modinfo import parse_module, read_module

DATA = Path(__file__).parent / "smoke" / "data"
VGEM = (DATA / "vgem.ko").read_bytes()
PEERMEM = (DATA / "nvidia-peermem.ko").read_bytes()
FIELDS = ("vermagic", "version", "srcversion", "depends", "license", "name")


def modinfo_8(path: Path, field: str) -> str:
    if runner.which("modinfo") is None and not Path("/usr/sbin/modinfo").exists():
        pytest.skip("no modinfo(8) to compare with")
    argv = [runner.which("modinfo") or "/usr/sbin/modinfo", "-F", field, path]
    return runner.run(argv, timeout=60).stdout.strip()


def cached_modules(test_cache: Path, count: int) -> list[Path]:
    """A fixed sample of the real kernel modules (.ko and .ko.xz) the smoke tier fetched."""
    found = sorted((test_cache / "kernels").glob("*/lib/modules/*/kernel/drivers/*/*.ko*"))
    if not found:
        pytest.skip("no kernels in the test cache (the slow smoke tier fetches them)")
    return sorted(random.Random(29).sample(found, min(count, len(found))))


def test_the_recorded_modules() -> None:
    vgem = read_module(DATA / "vgem.ko")
    assert vgem.name == "vgem" and vgem.signed
    assert vgem.vermagic == "6.1.0-56-amd64 SMP preempt mod_unload modversions "
    assert vgem.release == "6.1.0-56-amd64"
    assert vgem.flags == frozenset({"SMP", "preempt", "mod_unload", "modversions"})
    assert vgem.depends == ["drm", "drm_shmem_helper"] and vgem.gpl_compatible
    peermem = read_module(DATA / "nvidia-peermem.ko")
    assert peermem.name == "nvidia_peermem" and not peermem.signed and not peermem.gpl_compatible
    assert peermem.version == "535.309.01" and peermem.depends == []
    assert peermem.srcversion == "66A2DB34C2081E213629EBF"


@pytest.mark.parametrize("name", ["vgem.ko", "nvidia-peermem.ko"])
def test_the_same_strings_as_modinfo(name: str) -> None:
    facts = read_module(DATA / name)
    for field in FIELDS:
        assert facts.field(field).strip() == modinfo_8(DATA / name, field), field


def test_real_kernel_modules_read_like_modinfo(test_cache: Path) -> None:
    sample = cached_modules(test_cache, 24)
    for path in sample:
        facts = read_module(path)
        assert facts.name == modinfo.module_name(path.name)
        for field in ("vermagic", "srcversion", "depends", "license"):
            # modinfo -F prints every value of a repeated key (sr_mod has MODULE_LICENSE twice), one a line
            shown = "\n".join(v.strip() for v in facts.modinfo.get(field, []))
            assert shown == modinfo_8(path, field), (path, field)
        assert facts.signed == bool(modinfo_8(path, "signer")), path


@pytest.mark.parametrize("suffix, pack", [
    (".xz", lzma.compress), (".gz", lambda b: gzip.compress(b, mtime=0)),
    (".zst", lambda b: zstandard.ZstdCompressor().compress(b))])
def test_compressed_modules_read_like_plain_ones(tmp_path: Path, suffix: str, pack) -> None:  # type: ignore
    path = tmp_path / f"vgem.ko{suffix}"
    path.write_bytes(pack(VGEM))
    assert read_module(path) == read_module(DATA / "vgem.ko")
    assert modinfo.module_bytes(path) == VGEM
    path.write_bytes(b"not " + suffix.encode())
    with pytest.raises(ElfError, match=f"vgem.ko{suffix}: cannot decompress"):
        read_module(path)


def test_what_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.ko")
    (tmp_path / "link.ko").symlink_to(DATA / "vgem.ko")
    for name in ("fifo.ko", "link.ko", "missing.ko"):
        with pytest.raises(ElfError, match=f"{name}: cannot read it"):
            read_module(tmp_path / name)


@pytest.mark.parametrize("data, why", [
    (b"", "ELF identification"), (b"MZ" + bytes(100), "not an ELF file"), (VGEM[:63], "ELF header"),
    (VGEM[:4096], "lies outside the file"), (b"\x7fELF\x02\x01" + bytes(58), "no section table")])
def test_truncated_and_foreign_bytes(data: bytes, why: str) -> None:
    with pytest.raises(ElfError, match=f"x.ko: not a valid kernel module .*{why}"):
        parse_module(data, "x.ko")


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(seed=st.sampled_from([VGEM, PEERMEM]),
       cut=st.one_of(st.none(), st.integers(0, len(PEERMEM))),
       edits=st.lists(st.tuples(st.integers(0, 1 << 12), st.integers(0, 255)), max_size=12),
       tail_edits=st.lists(st.tuples(st.integers(1, 1 << 12), st.integers(0, 255)), max_size=4))
def test_mutated_modules_raise_only_elf_errors(seed: bytes, cut: int | None, edits: list[tuple[int, int]],
                                               tail_edits: list[tuple[int, int]]) -> None:
    data = bytearray(seed if cut is None else seed[:cut])
    for at, value in edits:  # the ELF and section headers are at the start
        if at < len(data):
            data[at] = value
    for back, value in tail_edits:  # the section table sits at the end
        if back <= len(data):
            data[-back] = value
    try:
        facts = parse_module(bytes(data), "m")
    except ElfError:
        return
    assert isinstance(facts.vermagic, str) and isinstance(facts.versions, dict)


@given(st.binary(max_size=4096))
def test_random_bytes_raise_only_elf_errors(data: bytes) -> None:
    for blob in (data, b"\x7fELF\x02\x01\x01" + data, b"\x7fELF\x01\x02\x01" + data):
        try:
            parse_module(blob, "m")
        except ElfError:
            pass


@pytest.fixture
def alarm() -> Iterator[None]:
    """Fail instead of hanging on a FIFO planted in an image."""
    def hung(*_: object) -> None:
        raise TimeoutError("blocked on a file in the image")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def test_node_reads_the_target_kernels_vermagic_past_hostile_files(tmp_path: Path, alarm: None) -> None:
    """An image's kernel module directory with a FIFO and garbage sorted before a real module: the
    vermagic comes from the real one, and nothing blocks."""
    from nodeprep.node.kmod import check_modules, kernel_vermagic
    from nodeprep.node.layout import Layout

    release = "6.1.0-56-amd64"
    kdir = tmp_path / "lib/modules" / release / "kernel"
    kdir.mkdir(parents=True)
    os.mkfifo(kdir / "a-fifo.ko")
    (kdir / "b-garbage.ko").write_bytes(b"\x7fELF" + bytes(60))
    (kdir / "c-vgem.ko").write_bytes(VGEM)
    magic = kernel_vermagic(Layout(tmp_path), release)
    assert magic is not None and str(magic) == "6.1.0-56-amd64 SMP mod_unload modversions preempt"
    built = tmp_path / "built"
    built.mkdir()
    (built / "nvidia-peermem.ko").write_bytes(PEERMEM)
    assert check_modules(built, release, magic) == {"nvidia-peermem": "535.309.01"}
    with pytest.raises(InputError, match="built for kernel 6.1.0-56-amd64 but the target kernel is 6.1.0-50"):
        check_modules(built, "6.1.0-50-amd64", None)
    (built / "nvidia.ko").write_bytes(PEERMEM[:5000])
    with pytest.raises(InputError, match="nvidia.ko: not a valid kernel module"):
        check_modules(built, release, magic)
