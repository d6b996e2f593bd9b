"""An ELF file's facts read from hostile bytes: a shared object's DT_SONAME, read the way `ldconfig`
reads it, and the section table (`Sections`) a kernel module's facts are read from (modinfo.py).

`soname(read, size)` is pure over `read(offset, length) -> bytes` (fewer bytes only at the end of
the input), so it serves files (`file_soname`, by pread) and buffers alike. It follows the program
headers, as ldconfig and the dynamic loader do (section headers are not trusted): every PT_DYNAMIC
segment is walked up to its DT_NULL, each DT_STRTAB address is mapped to a file offset both ways
glibc's ldconfig has done it (the first PT_LOAD's vaddr - offset, and the PT_LOAD that holds the
address), and every DT_SONAME is read under each. Readings that disagree are an error, so no
version of ldconfig can see another name than the one returned. Every read is bounded (MAX_*);
anything malformed raises ElfError and nothing else (NotElf, a subclass, when not even the ELF
header can be read: ldconfig reads no name from such a file either).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass

from .errors import ArtifactError

MAGIC = b"\x7fELF"
PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_STRTAB, DT_SONAME = 0, 5, 14
MAX_PHDRS = 1024  # real shared objects have about a dozen
MAX_DYNAMIC_SEGMENTS = 8
MAX_DYNAMIC_BYTES = 1 << 20  # real .dynamic sections hold under 100 entries
MAX_TAGS = 16  # DT_STRTAB or DT_SONAME entries in one segment (real: one each)
MAX_NAME = 4096
MAX_SECTION_BYTES = 64 << 20  # one section read whole (.modinfo, .symtab, .strtab): real ones are far less


class ElfError(ArtifactError):
    """The bytes are not an ELF file whose SONAME can be read unambiguously."""


class NotElf(ElfError):
    """No ELF header a loader could read at all (no magic, too short, unknown class or byte
    order): ldconfig passes such a file by, so it names no library."""


# (header size, header layout after e_ident, phdr size, phdr layout, dyn size, dyn layout, bits)
_CLASSES = {
    1: (52, "HHIIIIIHHHHHH", 32, "IIIIIIII", 8, "iI", 32),
    2: (64, "HHIQQQIHHHHHH", 56, "IIQQQQQQ", 16, "qQ", 64),
}
# (section header size and layout, symbol size and layout (name, info, shndx picked by _SYM_FIELDS))
_SECTION_CLASSES = {
    1: (40, "IIIIIIIIII", 16, "IIIBBH"),
    2: (64, "IIQQQQIIQQ", 24, "IBBHQQ"),
}
_SYM_FIELDS = {1: (0, 3, 5), 2: (0, 1, 3)}
_SYM_VALUE = {1: 1, 2: 4}  # st_value's place in each class's symbol layout
SHN_ABS = 0xFFF1


def is_elf(head: bytes) -> bool:
    return head[:4] == MAGIC


def soname(read: Callable[[int, int], bytes], size: int, *, byteorder: str | None = None) -> str | None:
    """The DT_SONAME of the ELF file of `size` bytes that `read` serves; None when it has no dynamic
    segment or no DT_SONAME. `byteorder` ("<" or ">") overrides the file's EI_DATA (read the file
    as a loader of that byte order would). Raises ElfError for anything malformed or ambiguous."""
    try:
        return _soname(read, size, byteorder)
    except ElfError:
        raise
    except (struct.error, ValueError, OverflowError) as e:
        raise ElfError(f"malformed ELF file ({e})") from None


def _exact(read: Callable[[int, int], bytes], size: int, offset: int, length: int, what: str) -> bytes:
    if offset < 0 or length < 0 or offset + length > size:
        raise ElfError(f"{what} lies outside the file (offset {offset}, {length} bytes, file {size})")
    data = read(offset, length)
    if len(data) != length:
        raise ElfError(f"{what}: short read")
    return data


def _header(read: Callable[[int, int], bytes], size: int,
            byteorder: str | None) -> tuple[int, str, tuple[int, ...]]:
    """(ELF class, byte order, the header's fields after e_ident); NotElf when there is none."""
    if size < 16:
        raise NotElf(f"ELF identification: the file has {size} bytes")
    ident = _exact(read, size, 0, 16, "ELF identification")
    if not is_elf(ident):
        raise NotElf("not an ELF file")
    layout = _CLASSES.get(ident[4])
    if layout is None:
        raise NotElf(f"unknown ELF class {ident[4]}")
    if byteorder is None:
        if ident[5] not in (1, 2):
            raise NotElf(f"unknown ELF byte order {ident[5]}")
        byteorder = "<" if ident[5] == 1 else ">"
    ehsize, ehfmt = layout[0], layout[1]
    if size < ehsize:
        raise NotElf(f"ELF header: the file has {size} bytes, the header {ehsize}")
    header = _exact(read, size, 16, ehsize - 16, "ELF header")
    return ident[4], byteorder, struct.unpack(byteorder + ehfmt, header)


def _soname(read: Callable[[int, int], bytes], size: int, byteorder: str | None) -> str | None:
    elfclass, byteorder, fields = _header(read, size, byteorder)
    _, _, phsize, phfmt, dynsize, dynfmt, bits = _CLASSES[elfclass]
    phoff, phentsize, phnum = fields[4], fields[8], fields[9]
    if phnum == 0:
        return None
    if phentsize != phsize:
        raise ElfError(f"program header size {phentsize}, expected {phsize}")
    if phnum > MAX_PHDRS:
        raise ElfError(f"{phnum} program headers (at most {MAX_PHDRS})")
    table = _exact(read, size, phoff, phnum * phsize, "program header table")
    loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
    dynamics: list[int] = []
    for (p_type, *rest) in struct.iter_unpack(byteorder + phfmt, table):
        if bits == 64:
            _, p_offset, p_vaddr, _, p_filesz, _, _ = rest
        else:
            p_offset, p_vaddr, _, p_filesz, _, _, _ = rest
        if p_type == PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == PT_DYNAMIC:
            dynamics.append(p_offset)
    if len(dynamics) > MAX_DYNAMIC_SEGMENTS:
        raise ElfError(f"{len(dynamics)} PT_DYNAMIC segments (at most {MAX_DYNAMIC_SEGMENTS})")
    names = set()
    for offset in dynamics:
        strtabs, sonames = _dynamic_tags(read, size, offset, byteorder + dynfmt, dynsize)
        if sonames and not strtabs:
            raise ElfError("DT_SONAME without DT_STRTAB")
        for strtab in strtabs:
            for base in _file_offsets(strtab, loads, bits):
                for value in sonames:
                    names.add(_string(read, size, base + value))
    if len(names) > 1:
        raise ElfError("ambiguous SONAME: " + ", ".join(sorted(repr(n) for n in names)))
    return names.pop() if names else None


def _dynamic_tags(read: Callable[[int, int], bytes], size: int, offset: int, fmt: str,
                  entsize: int) -> tuple[list[int], list[int]]:
    """DT_STRTAB and DT_SONAME values of the dynamic array at `offset`, read up to its DT_NULL
    (as ldconfig does, whatever the segment's p_filesz says)."""
    if offset >= size:
        raise ElfError(f"PT_DYNAMIC at offset {offset} lies outside the file ({size} bytes)")
    end = min(size, offset + MAX_DYNAMIC_BYTES)
    strtabs: list[int] = []
    sonames: list[int] = []
    pos = offset
    while pos + entsize <= end:
        chunk = _exact(read, size, pos, min(end - pos, 64 * 1024) // entsize * entsize, "dynamic array")
        for tag, value in struct.iter_unpack(fmt, chunk):
            if tag == DT_NULL:
                return strtabs, sonames
            if tag in (DT_STRTAB, DT_SONAME):
                found = strtabs if tag == DT_STRTAB else sonames
                found.append(value)
                if len(found) > MAX_TAGS:
                    raise ElfError(f"more than {MAX_TAGS} entries of tag {tag} in the dynamic array")
        pos += len(chunk)
    raise ElfError("dynamic array without DT_NULL")


def _file_offsets(addr: int, loads: list[tuple[int, int, int]], bits: int) -> set[int]:
    """Where ldconfig looks for the string table at `addr`: older glibc subtracts the first
    PT_LOAD's vaddr - offset, later glibc that of the first PT_LOAD whose file bytes hold `addr`
    (0 when there is none), in the address width of the file."""
    mask = (1 << bits) - 1
    first = loads[0][0] - loads[0][1] if loads else 0
    holding = next((v - o for v, o, n in loads if v <= addr < v + n), 0)
    return {(addr - first) & mask, (addr - holding) & mask}


def _string(read: Callable[[int, int], bytes], size: int, offset: int) -> str:
    if offset >= size:
        raise ElfError(f"SONAME string at offset {offset} lies outside the file ({size} bytes)")
    data = _exact(read, size, offset, min(MAX_NAME + 1, size - offset), "SONAME string")
    end = data.find(b"\0")
    if end < 0:
        raise ElfError(f"SONAME string at offset {offset} is not terminated within {MAX_NAME} bytes")
    return data[:end].decode("utf-8", "surrogateescape")


def file_soname(fd: int, *, byteorder: str | None = None) -> str | None:
    """soname() of the open regular file `fd` (read with pread; the offset is not moved)."""
    size = os.fstat(fd).st_size
    return soname(lambda off, n: os.pread(fd, n, off), size, byteorder=byteorder)


SHT_NOBITS = 8


@dataclass(frozen=True)
class Section:
    name: str
    type: int
    offset: int
    size: int
    link: int  # index of the related section (a symbol table's string table)
    entsize: int


class Sections:
    """The section table of an ELF file of `size` bytes that `read` serves (an object file, a kernel
    module). Every offset and size is checked against the file and bounded; anything malformed
    raises ElfError (NotElf without an ELF header)."""

    def __init__(self, read: Callable[[int, int], bytes], size: int) -> None:
        self._read, self._size = read, size
        try:
            self.elfclass, self.byteorder, fields = _header(read, size, None)
            shsize, shfmt, self._symsize, self._symfmt = _SECTION_CLASSES[self.elfclass]
            shoff, shentsize, shnum, shstrndx = fields[5], fields[10], fields[11], fields[12]
            if shnum == 0:
                raise ElfError("no section table")
            if shentsize != shsize:
                raise ElfError(f"section header size {shentsize}, expected {shsize}")
            table = _exact(read, size, shoff, shnum * shsize, "section header table")
            raw = [struct.unpack_from(self.byteorder + shfmt, table, i * shsize) for i in range(shnum)]
            if shstrndx >= shnum:
                raise ElfError(f"section name table {shstrndx} of {shnum} sections")
            names = self._bytes_of(raw[shstrndx][1], raw[shstrndx][4], raw[shstrndx][5], "section names")
            self.table = [Section(_name_at(names, h[0]), h[1], h[4], h[5], h[6], h[9]) for h in raw]
        except ElfError:
            raise
        except (struct.error, ValueError, OverflowError, IndexError) as e:
            raise ElfError(f"malformed ELF file ({e})") from None
        self.by_name: dict[str, Section] = {}
        for sec in self.table:
            self.by_name.setdefault(sec.name, sec)

    def _bytes_of(self, kind: int, offset: int, size: int, what: str) -> bytes:
        if kind == SHT_NOBITS:
            return b""
        if size > MAX_SECTION_BYTES:
            raise ElfError(f"{what}: {size} bytes (at most {MAX_SECTION_BYTES})")
        return _exact(self._read, self._size, offset, size, what)

    def data(self, section: Section) -> bytes:
        """The bytes of `section` (empty for SHT_NOBITS)."""
        return self._bytes_of(section.type, section.offset, section.size, f"section {section.name!r}")

    def symbols(self, section: Section) -> list[tuple[str, int, int]]:
        """(name, st_info, st_shndx) of every named entry of the symbol table `section`."""
        return [(name, info, shndx) for name, info, shndx, _ in self.symbol_values(section)]

    def symbol_values(self, section: Section) -> list[tuple[str, int, int, int]]:
        """(name, st_info, st_shndx, st_value) of every named entry of the symbol table `section`."""
        if section.entsize != self._symsize:
            raise ElfError(f"symbol table entry size {section.entsize}, expected {self._symsize}")
        if section.link >= len(self.table):
            raise ElfError(f"symbol table names string table {section.link} of {len(self.table)}")
        strings = self.data(self.table[section.link])
        entries = self.data(section)
        name_i, info_i, shndx_i = _SYM_FIELDS[self.elfclass]
        value_i = _SYM_VALUE[self.elfclass]
        out = []
        try:
            for fields in struct.iter_unpack(self.byteorder + self._symfmt,
                                             entries[:len(entries) - len(entries) % self._symsize]):
                if fields[name_i]:
                    out.append((_name_at(strings, fields[name_i]), fields[info_i], fields[shndx_i],
                                fields[value_i]))
        except struct.error as e:
            raise ElfError(f"malformed symbol table ({e})") from None
        return out


def _name_at(table: bytes, offset: int) -> str:
    """The NUL-terminated name at `offset` of a string table."""
    end = table.find(b"\0", offset)
    if offset >= len(table) or end < 0:
        raise ElfError(f"name at offset {offset} outside its string table ({len(table)} bytes)")
    return table[offset:end].decode("utf-8", "surrogateescape")
