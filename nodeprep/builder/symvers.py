"""The static symbol check of the smoke test: a module's undefined symbols against the kernel's
Module.symvers (name, CRC, GPL-only) and the exports of the modules loaded before it, for the modules
that cannot load without a GPU. The module's side is nodeprep.modinfo."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..errors import InputError
from ..modinfo import ModuleInfo


@dataclass(frozen=True)
class Export:
    crc: int
    module: str  # "vmlinux" or a module path without .ko
    gpl_only: bool


def parse_symvers(text: str) -> dict[str, Export]:
    """Module.symvers ("0xCRC<TAB>symbol<TAB>module<TAB>EXPORT_SYMBOL[_GPL]<TAB>namespace")."""
    result: dict[str, Export] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) < 4:
            raise InputError(f"Module.symvers line {n}: expected 4 or 5 tab-separated fields")
        result[parts[1]] = Export(int(parts[0], 16), parts[2], parts[3] == "EXPORT_SYMBOL_GPL")
    return result


def check_symbols(module: ModuleInfo, symvers: Mapping[str, Export],
                  providers: Iterable[ModuleInfo] = ()) -> list[str]:
    """Problems the kernel would report when loading `module` after `providers`: undefined symbols
    nobody exports, CRC mismatches against the kernel's and the providers' exports, GPL-only symbols used by a
    module whose licence is not GPL-compatible. Empty list: every symbol resolves."""
    provided = {sym: p.name for p in providers for sym in p.exports}
    provided_crcs = {sym: (p.name, crc) for p in providers for sym, crc in p.export_crcs.items()}
    problems: list[str] = []
    layout = module.versions.get("module_layout")
    if layout is not None and "module_layout" in symvers and symvers["module_layout"].crc != layout:
        problems.append(f"{module.name}: disagrees about version of symbol module_layout "
                        f"(module 0x{layout:08x}, kernel 0x{symvers['module_layout'].crc:08x})")
    for sym in module.undefined:
        if sym in provided:
            crc = module.versions.get(sym)
            if crc is not None and sym in provided_crcs and provided_crcs[sym][1] != crc:
                by, theirs = provided_crcs[sym]
                problems.append(f"{module.name}: disagrees about version of symbol {sym} "
                                f"(module 0x{crc:08x}, {by} 0x{theirs:08x})")
            continue
        export = symvers.get(sym)
        if export is None:
            problems.append(f"{module.name}: Unknown symbol {sym}")
            continue
        crc = module.versions.get(sym)
        if crc is not None and crc != export.crc:
            problems.append(f"{module.name}: disagrees about version of symbol {sym} "
                            f"(module 0x{crc:08x}, kernel 0x{export.crc:08x})")
        if export.gpl_only and not module.gpl_compatible:
            problems.append(f"{module.name}: uses GPL-only symbol {sym} with licence "
                            f"{module.field('license')!r}")
    return problems
