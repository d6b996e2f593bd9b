"""nodeprep.elf reads a shared object's DT_SONAME the way ldconfig does, from hostile bytes.

Real inputs: shared objects, an executable and an object file compiled here by gcc (64-bit, and
32-bit where gcc -m32 links), compared with what binutils' readelf prints. Big-endian and crafted
files are written byte by byte (tests/support/elfsynth.py). Hypothesis mutates real objects and
crafted ones: the reader returns a name or None, or raises ElfError, and nothing else, reading at
most a bounded number of bytes however large the file claims to be.
"""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodeprep import elf, runner
from nodeprep.errors import ArtifactError, CommandError
from tests.support.elfsynth import DT_SONAME, DT_STRTAB, STRINGS_AT, compile_so, synth


def soname_of(data: bytes, **kw: str) -> str | None:
    return elf.soname(lambda off, n: data[off:off + n], len(data), **kw)


def readelf_soname(path: Path) -> str | None:
    if runner.which("readelf") is None:
        pytest.skip("no readelf")
    out = runner.run(["readelf", "-d", str(path)], timeout=60).stdout
    m = re.search(r"\(SONAME\)\s+Library soname: \[(.*)\]", out)
    return m.group(1) if m else None


@pytest.fixture(scope="module")
def objects(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("elf")
    out = {
        "plain": compile_so(work / "libplain.so.1.2.3", "libplain.so.1"),
        "evil": compile_so(work / "libevil.so", "../../../../tmp/x/victim-link"),
        "none": compile_so(work / "libnone.so", None),
    }
    src = work / "main.c"
    src.write_text("int main(void) { return 0; }\n")
    runner.run([runner.which("gcc") or "cc", "-o", str(work / "exe"), str(src)], timeout=60)
    runner.run([runner.which("gcc") or "cc", "-c", "-o", str(work / "obj.o"), str(src)], timeout=60)
    out["exe"], out["obj"] = work / "exe", work / "obj.o"
    try:
        out["m32"] = compile_so(work / "lib32.so.7.0", "lib32.so.7", m32=True)
    except CommandError:
        pass
    return out


@pytest.mark.parametrize("which", ["plain", "evil", "none", "exe", "obj", "m32"])
def test_reads_what_readelf_reads(objects: dict[str, Path], which: str) -> None:
    if which not in objects:
        pytest.skip("gcc -m32 cannot link here")
    path = objects[which]
    fd = os.open(path, os.O_RDONLY)
    try:
        assert elf.file_soname(fd) == readelf_soname(path)
    finally:
        os.close(fd)
    if which == "m32":
        assert path.read_bytes()[4] == 1  # ELFCLASS32


def test_known_names() -> None:
    assert soname_of(synth(b"libcuda.so.1")) == "libcuda.so.1"
    assert soname_of(synth(None)) is None


@pytest.mark.parametrize("bits", [32, 64])
@pytest.mark.parametrize("order", ["<", ">"])
def test_both_classes_and_byte_orders(bits: int, order: str) -> None:
    data = synth(b"libnvidia-ml.so.1", bits=bits, order=order)
    assert soname_of(data) == "libnvidia-ml.so.1"
    other = "<" if order == ">" else ">"
    with pytest.raises(elf.ElfError):  # as a loader of the other byte order would read it
        soname_of(data, byteorder=other)


def test_errors_are_artifact_errors() -> None:
    assert issubclass(elf.ElfError, ArtifactError)  # exit 2 at the CLI, like every refused artifact
    assert issubclass(elf.NotElf, elf.ElfError)


@pytest.mark.parametrize("data, why", [
    (b"", "ELF identification"),
    (b"\x7fELF", "ELF identification"),
    (synth()[:40], "ELF header"),
    (b"\x7fELX" + bytes(60), "not an ELF file"),
    (b"\x7fELF\x03\x01\x01" + bytes(57), "unknown ELF class"),
    (b"\x7fELF\x02\x07\x01" + bytes(57), "unknown ELF byte order"),
    (synth()[:100], "program header table"),
    (synth()[:0x208], "dynamic array without DT_NULL"),
])
def test_truncated_and_foreign(data: bytes, why: str) -> None:
    with pytest.raises(elf.ElfError, match=why) as e:
        soname_of(data)
    # no header a loader could read (NotElf) or a header whose tables are broken
    readable_header = len(data) >= 64 and data[:4] == b"\x7fELF" and data[4] in (1, 2) and data[5] in (1, 2)
    assert isinstance(e.value, elf.NotElf) != readable_header


def test_hostile_layouts() -> None:
    base = 0x400000
    with pytest.raises(elf.ElfError, match="lies outside the file"):  # string offset far away
        soname_of(synth(dynamic=[(DT_STRTAB, base + STRINGS_AT), (DT_SONAME, 1 << 40)]))
    with pytest.raises(elf.ElfError, match="without DT_STRTAB"):
        soname_of(synth(dynamic=[(DT_SONAME, 1)]))
    for tail in (b"abc", b"a" * (elf.MAX_NAME + 10) + b"\0"):  # to the end of the file, or too long
        end = synth(dynamic=[(DT_STRTAB, base + 0x230), (DT_SONAME, 0)], loads=[(base, 0, 0x10000)])
        assert len(end) == 0x230
        with pytest.raises(elf.ElfError, match="not terminated"):
            soname_of(end + tail)
    with pytest.raises(elf.ElfError, match="ambiguous SONAME"):  # two DT_SONAMEs that disagree
        soname_of(synth(strings=b"\0libone.so.1\0libtwo.so.1\0",
                        dynamic=[(DT_STRTAB, base + STRINGS_AT), (DT_SONAME, 1), (DT_SONAME, 13)]))
    # two PT_LOADs: the first one's vaddr - offset (older glibc) and the one holding the string
    # table (later glibc) put it at different offsets: another ldconfig would read another name
    strings = b"\0libone.so.1\0".ljust(0x10, b"\0") + b"\0libtwo.so.1\0"
    twice = synth(strings=strings, loads=[(base + 0x1000, 0x1010, 0x10), (base, 0, 0x300)])
    with pytest.raises(elf.ElfError, match="ambiguous SONAME: 'libone.so.1', 'libtwo.so.1'"):
        soname_of(twice)
    assert soname_of(synth(strings=strings, loads=[(base, 0, 0x300), (base + 0x1000, 0x1010, 0x10)])) \
        == "libone.so.1"  # where both readings agree


def test_overlapping_but_consistent_is_read() -> None:
    """The string table may overlap the dynamic array: what matters is one reading."""
    base = 0x400000
    data = bytearray(synth(strings=b"\0libo.so.2\0"))
    data[0x200 - 8:0x200] = b"\0" * 8
    assert soname_of(bytes(data)) == "libo.so.2"
    assert soname_of(synth(dynamic=[(DT_STRTAB, base + STRINGS_AT), (DT_SONAME, 1), (DT_SONAME, 1)])) \
        == "libx.so.1"


def test_reads_are_bounded() -> None:
    """A file claiming a huge size whose dynamic array never ends is read a bounded amount."""
    head = synth()[:0x200]
    seen: list[int] = []

    def read(off: int, n: int) -> bytes:
        seen.append(n)
        return bytes((head + b"\x01" * (off + n))[off:off + n])  # the header, then 0x01 for ever

    with pytest.raises(elf.ElfError, match="without DT_NULL"):
        elf.soname(read, 1 << 40)
    assert max(seen) <= 64 * 1024
    assert sum(seen) <= elf.MAX_DYNAMIC_BYTES + 4096


def test_huge_program_header_count_is_refused_before_reading() -> None:
    data = bytearray(synth())
    struct.pack_into("<H", data, 0x38, 0xFFFF)  # e_phnum
    seen: list[int] = []
    with pytest.raises(elf.ElfError, match="program headers"):
        elf.soname(lambda off, n: seen.append(n) or bytes(data[off:off + n]), 1 << 40)
    assert sum(seen) <= 64


def _mutated(seed: bytes, edits: list[tuple[int, int]], cut: int | None) -> bytes:
    data = bytearray(seed)
    for pos, value in edits:
        data[pos % len(data)] = value
    return bytes(data[:cut] if cut is not None else data)


SEEDS = [synth(b"libcuda.so.1"), synth(b"libx.so.1", bits=32), synth(b"liby.so.2", order=">"),
         synth(b"libz.so.3", bits=32, order=">")]


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.sampled_from(SEEDS),
       edits=st.lists(st.tuples(st.integers(0, 0x300), st.integers(0, 255)), max_size=12),
       cut=st.none() | st.integers(0, 0x300))
def test_mutated_headers_raise_only_elf_errors(seed: bytes, edits: list[tuple[int, int]],
                                               cut: int | None) -> None:
    data = _mutated(seed, edits, cut)
    total = 0

    def read(off: int, n: int) -> bytes:
        nonlocal total
        assert 0 <= off and 0 <= n <= 64 * 1024 + elf.MAX_NAME
        total += n
        return data[off:off + n]

    try:
        name = elf.soname(read, len(data))
    except elf.ElfError:
        return
    finally:
        assert total <= 8 * elf.MAX_DYNAMIC_BYTES
    assert name is None or isinstance(name, str)


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture], max_examples=60)
@given(edits=st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), min_size=1, max_size=8))
def test_mutated_real_object_raises_only_elf_errors(objects: dict[str, Path],
                                                    edits: list[tuple[int, int]]) -> None:
    data = _mutated(objects["plain"].read_bytes(), edits, None)
    try:
        name = soname_of(data)
    except elf.ElfError:
        return
    assert name is None or isinstance(name, str)
