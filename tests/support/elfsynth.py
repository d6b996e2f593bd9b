"""Minimal ELF shared objects written byte by byte (either class, either byte order), and real
ones compiled here with gcc, for tests of nodeprep.elf and the SONAME rule."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from nodeprep import runner

STRINGS_AT, DYNAMIC_AT = 0x100, 0x200
DT_STRTAB, DT_SONAME = 5, 14


def synth(soname: bytes | None = b"libx.so.1", *, bits: int = 64, order: str = "<",
          dynamic: list[tuple[int, int]] | None = None, loads: list[tuple[int, int, int]] | None = None,
          strings: bytes | None = None) -> bytes:
    """An ELF file: header, two program headers (PT_LOAD, PT_DYNAMIC), a string table at
    STRINGS_AT (b"\\0" + soname + b"\\0" unless `strings`) and the dynamic array at DYNAMIC_AT
    (DT_STRTAB, DT_SONAME 1 unless `dynamic`; DT_NULL is appended). `loads`: the PT_LOAD
    headers as (vaddr, offset, filesz) (default: one mapping the file at vaddr 0x400000)."""
    base = 0x400000
    strings = strings if strings is not None else b"\0" + (soname or b"") + b"\0"
    if dynamic is None:
        dynamic = [(DT_STRTAB, base + STRINGS_AT)] + ([(DT_SONAME, 1)] if soname is not None else [])
    dynfmt = order + ("qQ" if bits == 64 else "iI")
    dyn = b"".join(struct.pack(dynfmt, t, v) for t, v in [*dynamic, (0, 0)])
    size = DYNAMIC_AT + len(dyn)
    loads = loads if loads is not None else [(base, 0, size)]
    phdrs = []
    for vaddr, offset, filesz in loads:
        phdrs.append((1, offset, vaddr, filesz))
    phdrs.append((2, DYNAMIC_AT, base + DYNAMIC_AT, len(dyn)))
    if bits == 64:
        ehsize, phsize = 64, 56
        head = struct.pack(order + "HHIQQQIHHHHHH", 3, 62, 1, 0, ehsize, 0, 0, ehsize, phsize, len(phdrs),
                           64, 0, 0)
        table = b"".join(struct.pack(order + "IIQQQQQQ", t, 4, o, v, v, n, n, 0x1000) for t, o, v, n in phdrs)
    else:
        ehsize, phsize = 52, 32
        head = struct.pack(order + "HHIIIIIHHHHHH", 3, 3, 1, 0, ehsize, 0, 0, ehsize, phsize, len(phdrs),
                           40, 0, 0)
        table = b"".join(struct.pack(order + "IIIIIIII", t, o, v, v, n, n, 4, 0x1000) for t, o, v, n in phdrs)
    ident = b"\x7fELF" + bytes([1 if bits == 32 else 2, 1 if order == "<" else 2, 1]) + bytes(9)
    out = bytearray(size)
    out[0:ehsize + len(table)] = ident + head + table
    out[STRINGS_AT:STRINGS_AT + len(strings)] = strings
    out[DYNAMIC_AT:] = dyn
    return bytes(out)


def compile_so(dest: Path, soname: str | None, *, m32: bool = False) -> Path:
    """A real shared object built by gcc (`-Wl,-soname,SONAME` unless None); skips without gcc."""
    cc = runner.which("gcc") or runner.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    src = dest.with_name(dest.name + ".c")
    src.write_text("int nodeprep_test_symbol(void) { return 42; }\n")
    argv = [cc, "-shared", "-fPIC", "-o", str(dest), str(src)]
    if soname is not None:
        argv.append(f"-Wl,-soname,{soname}")
    if m32:
        argv[1:1] = ["-m32", "-nostdlib"]
    runner.run(argv, timeout=120)
    src.unlink()
    return dest
