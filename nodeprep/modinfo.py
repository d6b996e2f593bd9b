"""What a kernel module says about itself, read from its bytes (no modinfo(8), no kernel).

One pure reader for the node (does a module fit the target kernel, node/kmod.py) and the smoke test
(vermagic, dependencies, symbols, builder/smoke.py): the `.modinfo` section (vermagic, version,
srcversion, depends, license), the symbol table (undefined symbols, exports), `__versions` (the CRCs
the kernel compares) and whether a signature is appended. The bytes come through
`read(offset, length)` as in nodeprep.elf, so a file is read by pread, section by section; anything
malformed raises ElfError (an ArtifactError) and nothing else. Compressed modules (.ko.xz/.gz/.zst,
as kernels ship them) are decompressed first, bounded.

modinfo(8) reads the same `.modinfo` strings (`modinfo -F vermagic` is this `vermagic`, stripped).
"""

from __future__ import annotations

import lzma
import os
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from .elf import SHN_ABS, ElfError, Sections
from .errors import InputError
from .sysfs import open_regular

SIG_MAGIC = b"~Module signature appended~\n"  # the trailer of an appended module signature
COMPRESSED = (".xz", ".gz", ".zst")
MAX_MODULE = 1 << 30  # decompressed; nvidia.ko is about 100 MB
MAX_MODINFO = 1 << 20  # real .modinfo sections hold a few KB
# licences the kernel counts as GPL-compatible (license_is_gpl_compatible): GPL-only exports are theirs
GPL_COMPATIBLE = frozenset({"GPL", "GPL v2", "GPL and additional rights", "Dual BSD/GPL", "Dual MIT/GPL",
                            "Dual MPL/GPL"})
VERSION_ENTRY = 64  # struct modversion_info: the CRC (an unsigned long), then the name


@dataclass(frozen=True)
class Vermagic:
    """`<release> <flags...>`, e.g. `6.1.0-28-amd64 SMP preempt mod_unload modversions `."""

    release: str
    flags: frozenset[str]

    def __str__(self) -> str:
        return " ".join([self.release, *sorted(self.flags)])


def parse_vermagic(text: str) -> Vermagic:
    parts = text.split()
    if not parts:
        raise InputError("empty vermagic")
    return Vermagic(release=parts[0], flags=frozenset(parts[1:]))


def module_name(path: str | PurePosixPath) -> str:
    """Kernel module name of a file: basename without .ko[.xz|.gz|.zst], '-' -> '_'."""
    name = PurePosixPath(path).name
    for suffix in COMPRESSED:
        name = name.removesuffix(suffix)
    return name.removesuffix(".ko").replace("-", "_")


@dataclass(frozen=True)
class ModuleInfo:
    """What the kernel's loader looks at in a .ko."""

    name: str
    modinfo: dict[str, list[str]]  # every key=value of .modinfo, in order
    signed: bool  # a signature is appended
    undefined: list[str] = field(default_factory=list)  # symbols it needs, sorted
    exports: list[str] = field(default_factory=list)  # symbols it exports, sorted
    versions: dict[str, int] = field(default_factory=dict)  # symbol -> CRC it was built against
    export_crcs: dict[str, int] = field(default_factory=dict)  # exported symbol -> its CRC (modversions)
    gpl_exports: list[str] = field(default_factory=list)  # exports in __ksymtab_gpl, sorted

    def field(self, key: str) -> str:
        values = self.modinfo.get(key, [])
        return values[0] if values else ""

    @property
    def vermagic(self) -> str:
        return self.field("vermagic")

    @property
    def release(self) -> str:
        """The kernel release the module was built for (vermagic's first word; "" without one)."""
        return self.vermagic.split(" ", 1)[0]

    @property
    def flags(self) -> frozenset[str]:
        """vermagic's flags: SMP, preempt, mod_unload, modversions, ..."""
        return frozenset(self.vermagic.split()[1:])

    @property
    def version(self) -> str:
        return self.field("version")

    @property
    def srcversion(self) -> str:
        return self.field("srcversion")

    @property
    def depends(self) -> list[str]:
        return [module_name(d) for d in self.field("depends").split(",") if d]

    @property
    def gpl_compatible(self) -> bool:
        return self.field("license") in GPL_COMPATIBLE


def module_info(read: Callable[[int, int], bytes], size: int, name: str) -> ModuleInfo:
    """The facts of the module of `size` bytes that `read(offset, length)` serves (fewer bytes
    only at the end). ElfError when it is not an ELF file with a readable section table."""
    secs = Sections(read, size)
    modinfo: dict[str, list[str]] = {}
    if (info := secs.by_name.get(".modinfo")) is not None:
        if info.size > MAX_MODINFO:
            raise ElfError(f".modinfo: {info.size} bytes (at most {MAX_MODINFO})")
        for item in secs.data(info).split(b"\0"):
            if b"=" in item:
                k, _, v = item.decode("utf-8", "replace").partition("=")
                modinfo.setdefault(k, []).append(v)
    undefined: set[str] = set()
    exports: set[str] = set()
    gpl: set[str] = set()
    crcs: dict[str, int] = {}
    section_data: dict[int, bytes] = {}
    if (symtab := secs.by_name.get(".symtab")) is not None:
        for sym, info_byte, shndx, value in secs.symbol_values(symtab):
            if shndx == 0 and (info_byte & 0xF) != 4:  # SHN_UNDEF, not STT_FILE
                undefined.add(sym)
            elif sym.startswith("__ksymtab_") and sym not in ("__ksymtab_gpl", "__ksymtab_strings"):
                exports.add(sym.removeprefix("__ksymtab_"))
                if shndx < len(secs.table) and secs.table[shndx].name == "__ksymtab_gpl":
                    gpl.add(sym.removeprefix("__ksymtab_"))
            elif sym.startswith("__crc_"):
                crc = _crc_value(secs, shndx, value, section_data)
                if crc is not None:
                    crcs[sym.removeprefix("__crc_")] = crc
    versions: dict[str, int] = {}
    if (vers := secs.by_name.get("__versions")) is not None:
        raw = secs.data(vers)
        crc_fmt, at = ("Q", 8) if secs.elfclass == 2 else ("I", 4)  # unsigned long, then the name
        for i in range(0, len(raw) - VERSION_ENTRY + 1, VERSION_ENTRY):
            crc, = struct.unpack_from(secs.byteorder + crc_fmt, raw, i)
            sym = raw[i + at:i + VERSION_ENTRY].split(b"\0", 1)[0].decode("utf-8", "replace")
            versions[sym] = crc & 0xFFFFFFFF
    signed = size >= len(SIG_MAGIC) and read(size - len(SIG_MAGIC), len(SIG_MAGIC)) == SIG_MAGIC
    return ModuleInfo(name=name, modinfo=modinfo, signed=signed, undefined=sorted(undefined),
                       exports=sorted(exports), versions=versions,
                       export_crcs={k: v for k, v in sorted(crcs.items()) if k in exports},
                       gpl_exports=sorted(gpl))


def _crc_value(secs: Sections, shndx: int, value: int, cache: dict[int, bytes]) -> int | None:
    """The CRC a `__crc_<sym>` symbol stands for: its value when absolute (kernels before 5.19), else
    the 32-bit word at its offset in its section (`__kcrctab*`, 5.19 and later); None when neither."""
    if shndx == SHN_ABS:
        return value & 0xFFFFFFFF
    if not 0 < shndx < len(secs.table):
        return None
    if shndx not in cache:
        cache[shndx] = secs.data(secs.table[shndx])
    data = cache[shndx]
    if value + 4 > len(data):
        return None
    crc, = struct.unpack_from(secs.byteorder + "I", data, value)
    return int(crc)


def parse_module(data: bytes, name: str) -> ModuleInfo:
    """module_info() of a module image in memory; ElfError naming `name`."""
    return _named(name, lambda: module_info(lambda off, n: data[off:off + n], len(data), name))


def read_module(path: Path) -> ModuleInfo:
    """module_info() of the file `path` (a regular file, not a link; .ko or compressed .ko.xz/.gz/.zst).
    ElfError names the file for anything unreadable or malformed."""
    name = module_name(path.name)
    try:
        fd = open_regular(path)
    except OSError as e:
        raise ElfError(f"{path.name}: cannot read it ({e.strerror or e})") from None
    try:
        if not path.name.endswith(COMPRESSED):
            size = os.fstat(fd).st_size
            return _named(path.name, lambda: module_info(lambda off, n: os.pread(fd, n, off), size, name))
        with os.fdopen(os.dup(fd), "rb") as f:
            data = decompress(path.name, f.read(MAX_MODULE + 1))
    finally:
        os.close(fd)
    return _named(path.name, lambda: module_info(lambda off, n: data[off:off + n], len(data), name))


def _named(label: str, facts: Callable[[], ModuleInfo]) -> ModuleInfo:
    try:
        return facts()
    except ElfError as e:
        raise ElfError(f"{label}: not a valid kernel module ({e})") from None


def module_bytes(path: Path) -> bytes:
    """A module's image, decompressed when the kernel stores it compressed (.ko.xz/.gz/.zst)."""
    return decompress(path.name, path.read_bytes())


def decompress(name: str, data: bytes) -> bytes:
    """`data` of the file `name`, decompressed by its suffix (at most MAX_MODULE bytes); ElfError
    when the bytes do not decompress."""
    try:
        if name.endswith(".xz"):
            out = lzma.LZMADecompressor().decompress(data, max_length=MAX_MODULE + 1)
        elif name.endswith(".gz"):
            out = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data, MAX_MODULE + 1)
        elif name.endswith(".zst"):
            out = _unzstd(data)
        else:
            return data
    except (lzma.LZMAError, zlib.error, EOFError, OSError, ValueError) as e:
        raise ElfError(f"{name}: cannot decompress it ({e})") from None
    if len(out) > MAX_MODULE:
        raise ElfError(f"{name}: more than {MAX_MODULE} bytes decompressed")
    return out


def _unzstd(data: bytes) -> bytes:
    # lazy: Ansible nodeprep_doctor
    import zstandard

    chunks, total = [], 0
    try:
        with zstandard.ZstdDecompressor().stream_reader(data) as reader:
            while total <= MAX_MODULE and (chunk := reader.read(1 << 20)):
                chunks.append(chunk)
                total += len(chunk)
    except zstandard.ZstdError as e:
        raise ValueError(f"zstd: {e}") from None
    return b"".join(chunks)
