"""The GPUDirect companion modules (nvidia-fs, gdrdrv) compiled in the driver's own build root clone,
against the driver's own tree, right after the driver (its compile or its compile-cache hit).

    nvidia.ko's exports -> nvidia.symvers (what modpost wrote for it: name, CRC, GPL-only)
    per companion: tarball unpacked at /build/companions/<name>/ -> its own probes (gdrcopy's
    scripts/test_gdrdrv_*.sh, gds-nvidia-fs's ./configure) -> kbuild against /lib/modules/<release>/build
    with NVIDIA_SRC_DIR = the directory of the driver's nv-p2p.h and KBUILD_EXTRA_SYMBOLS = nvidia.symvers
    -> strip -> facts checked (vermagic = nvidia.ko's, depends on nvidia, every symbol resolved by the
    kernel's Module.symvers or nvidia.ko with matching CRCs) -> kept by compile key like the driver.

The compiler is the build root's (the kernel's own, checked by compile.py before); nothing here
compiles the driver again.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .. import runner
from ..digests import canonical_json, sha256_bytes, sha256_file
from ..errors import BuildError, CommandError, InputError
from ..log import timed
from ..modinfo import ModuleInfo, read_module
from ..sources import companions as sources
from . import buildroot, kbuild
from .symvers import check_symbols, parse_symvers

log = logging.getLogger(__name__)

FORMAT = 1  # bump when the companions' build procedure changes its output
WORK_DIR = "/build/companions"  # inside the build root clone
P2P_PREFIX = "nvidia_p2p_"
# gdrcopy's own kbuild rules (its Makefile's KERNELRELEASE branch) without nv-p2p-dummy.o
GDRDRV_KBUILD = """include $(src)/Makefile
obj-m := $(filter-out nv-p2p-dummy.o,$(obj-m))
"""


def symvers_of(facts: ModuleInfo, module_path: str) -> str:
    """Module.symvers lines for the exports of `facts` (as modpost writes them for the module at
    `module_path`, without .ko): `0xCRC<TAB>symbol<TAB>module<TAB>EXPORT_SYMBOL[_GPL]<TAB>`."""
    lines = []
    for sym in facts.exports:
        crc = facts.export_crcs.get(sym)
        if crc is None:
            continue
        kind = "EXPORT_SYMBOL_GPL" if sym in facts.gpl_exports else "EXPORT_SYMBOL"
        lines.append(f"0x{crc:08x}\t{sym}\t{module_path}\t{kind}\t\n")
    return "".join(lines)


def p2p_header_dir(tree: Path) -> Path:
    """The directory of the driver tree's nv-p2p.h (`nvidia/` of a Debian or runfile tree,
    `kernel-open/nvidia/` of an open-source release)."""
    found = sorted(tree.rglob("nv-p2p.h"), key=lambda p: (p.parent.name != "nvidia", len(p.parts), str(p)))
    if not found:
        raise InputError(f"the driver tree has no nv-p2p.h: the GPUDirect modules need it ({tree})")
    return found[0].parent


def check_facts(name: str, facts: ModuleInfo, nvidia: ModuleInfo,
                kernel_symvers: Mapping[str, Any]) -> list[str]:
    """Problems with companion module `name` built beside `nvidia`: another vermagic, no dependency on
    nvidia, an nvidia_p2p_* symbol without its CRC, or any symbol the kernel would refuse."""
    problems = []
    if facts.vermagic.strip() != nvidia.vermagic.strip():
        problems.append(f"{name}: vermagic {facts.vermagic.strip()!r} is not nvidia.ko's "
                        f"{nvidia.vermagic.strip()!r}")
    if "nvidia" not in facts.depends:
        problems.append(f"{name}: depends on {','.join(facts.depends) or 'nothing'}, not nvidia "
                        "(its nvidia_p2p_* symbols were not resolved against nvidia.ko)")
    for sym in facts.undefined:
        if sym.startswith(P2P_PREFIX) and "modversions" in nvidia.flags and sym not in facts.versions:
            problems.append(f"{name}: no symbol version for {sym}")
    problems += check_symbols(facts, kernel_symvers, [nvidia])
    return problems


def compile_key(files: Mapping[str, Path], driver_key: str, kernel_release: str,
                build_root: list[str]) -> str:
    """The companions' compile key: their tarballs, the driver's compile key (its tree, headers and
    build root), the release and this procedure's format."""
    return sha256_bytes(canonical_json({
        "format": FORMAT,
        "companions": {n: sha256_file(p) for n, p in sorted(files.items())},
        "driver": driver_key,
        "kernel_release": kernel_release,
        "build_root": build_root,
    }))


def _make(clone: Path, argv: list[str], log_path: Path) -> None:
    runner.run(argv, root=clone, env=kbuild.REPRODUCIBLE_ENV, timeout=kbuild.MAKE_TIMEOUT, log_path=log_path)


def _probe(clone: Path, script: str, release: str) -> str:
    """gdrcopy's own probe script of a kernel feature (prints y or n)."""
    res = runner.run(["sh", script, "-k", release], root=clone, env=kbuild.REPRODUCIBLE_ENV, timeout=600)
    return "y" if res.stdout.strip().endswith("y") else "n"


def _build_one(name: str, kdir: str, clone: Path, release: str, p2p_dir: str, flavour: str, jobs: int,
               log_dir: Path) -> str:
    """Run the companion's probes and kbuild in `clone` (paths as seen inside it; logs
    `log_dir/<name>[-configure].log`); returns the .ko's path inside the clone."""
    log_path = log_dir / f"{name}.log"
    kernel = f"/lib/modules/{release}/build"
    common = [f"-j{jobs}", "-C", kernel, f"M={kdir}", "modules", f"NVIDIA_SRC_DIR={p2p_dir}",
              f"KBUILD_EXTRA_SYMBOLS={WORK_DIR}/nvidia.symvers", "KBUILD_MODPOST_WARN="]
    if name == "gdrdrv":
        top = kdir.removesuffix("/src/gdrdrv")
        flags = {
            "HAVE_VM_FLAGS_SET": _probe(clone, f"{top}/scripts/test_gdrdrv_HAVE_VM_FLAGS_SET.sh", release),
            "HAVE_PROC_OPS": _probe(clone, f"{top}/scripts/test_gdrdrv_HAVE_PROC_OPS.sh", release),
        }
        # gdrdrv only, not its compile-time nv-p2p-dummy (whose exports would shadow nvidia.ko's:
        # gdrdrv must depend on nvidia): kbuild reads a Kbuild file before the Makefile
        (clone / kdir.lstrip("/") / "Kbuild").write_text(GDRDRV_KBUILD)
        _make(clone, ["make", *common,
                      f"NVIDIA_IS_OPENSOURCE={'y' if flavour == 'open' else 'n'}",
                      *[f"{k}={v}" for k, v in flags.items()]], log_path)
        return f"{kdir}/gdrdrv.ko"
    # gds-nvidia-fs: its ./configure (config-host.h), then its Makefile's kbuild flags
    runner.run(["env", "-C", kdir, "sh", "./configure", release], root=clone, env=kbuild.REPRODUCIBLE_ENV,
               timeout=kbuild.MAKE_TIMEOUT, log_path=log_dir / f"{name}-configure.log")
    version = (clone / kdir.lstrip("/") / "GDS_VERSION").read_text(errors="replace").strip()
    if not re.fullmatch(r"\d+(\.\d+){0,3}", version):
        raise InputError(f"gds-nvidia-fs: src/GDS_VERSION {version[:40]!r} is not a version")
    cppflags = (f"-DCONFIG_NVFS_STATS=y -DGDS_VERSION={version} -DNVFS_ENABLE_KERN_RDMA_SUPPORT "
                "-DNVFS_BATCH_SUPPORT=y")
    _make(clone, ["make", *common, f"KCPPFLAGS={cppflags}", "CONFIG_NVFS_BATCH_SUPPORT=y",
                  "CONFIG_NVFS_STATS=y"], log_path)
    return f"{kdir}/nvidia-fs.ko"


def _build_in(name: str, tarball: Path, clone: Path, work: Path, release: str, p2p_dir: str, flavour: str,
              jobs: int, log_dir: Path, timings: dict[str, float]) -> str:
    """Unpack companion `name` under `work` and build it (_build_one); BuildError naming its log."""
    kdir = sources.extract(sources.COMPANIONS[name], tarball, work / name)
    inside = "/" + kdir.relative_to(clone).as_posix()
    start = time.monotonic()
    try:
        return _build_one(name, inside, clone, release, p2p_dir, flavour, jobs, log_dir)
    except CommandError as e:
        where = Path(e.log_path) if e.log_path else log_dir / f"{name}.log"
        raise BuildError(f"compiling {name} failed (exit {e.returncode}); full log: {where}",
                         hint=_tail(where)) from None
    finally:
        timings[f"companions_make_{name}"] = round(time.monotonic() - start, 2)


def compile_companions(files: Mapping[str, Path], *, clone: Path, tree: Path, driver_dir: Path,
                       driver_key: str, kernel_release: str, flavour: str, build_root: list[str],
                       cache: Path, jobs: int, log_dir: Path, rebuild: bool,
                       timings: dict[str, float]) -> tuple[Path, dict[str, Any]]:
    """Compile the companions `files` (name -> tarball) in the build root `clone`, whose driver tree is
    `tree` and whose compiled driver (nvidia.ko) is in `driver_dir`. Returns (the directory with the
    stripped companion .ko and modules.json, their facts for the manifest)."""
    nvidia = read_module(driver_dir / "nvidia.ko")
    if not any(s.startswith(P2P_PREFIX) for s in nvidia.exports):
        raise BuildError("nvidia.ko exports no nvidia_p2p_* symbols: the GPUDirect modules cannot be built")
    key = compile_key(files, driver_key, kernel_release, build_root)
    kept = cache / "kmod-builds" / key
    headers = clone / "usr" / "src" / f"linux-headers-{kernel_release}"
    kernel_symvers = parse_symvers((headers / "Module.symvers").read_text())
    compiled = False
    if rebuild or not (kept / "modules.json").is_file():
        compiled = True
        work = clone / WORK_DIR.lstrip("/")
        work.mkdir(parents=True)
        (work / "nvidia.symvers").write_text(symvers_of(nvidia, "nvidia"))
        p2p_dir = "/" + p2p_header_dir(tree).relative_to(clone).as_posix()
        log_dir.mkdir(parents=True, exist_ok=True)
        built = []
        with timed(timings, "companions_make", f"Compiling {', '.join(sorted(files))} for {kernel_release}"):
            # side by side: their probes are mostly one-file kbuild runs, one after another
            with ThreadPoolExecutor(max_workers=len(files)) as pool:
                jobs_of = {name: pool.submit(_build_in, name, tarball, clone, work, kernel_release, p2p_dir,
                                             flavour, jobs, log_dir, timings)
                           for name, tarball in sorted(files.items())}
                built = [jobs_of[name].result() for name in sorted(files)]
        runner.run(["strip", "--strip-debug", *built], root=clone, timeout=600)
        buildroot.keep_modules([clone / ko.lstrip("/") for ko in built], kept, cache / "tmp")
    else:
        log.info("Reusing the companion modules compiled earlier (%s…)", key[:12])
    facts: dict[str, Any] = {}
    problems: list[str] = []
    for ko in json.loads((kept / "modules.json").read_text())["modules"]:
        info = read_module(kept / ko)
        problems += check_facts(info.name, info, nvidia, kernel_symvers)
        facts[ko.removesuffix(".ko")] = {"version": info.version, "vermagic": info.vermagic.strip(),
                                         "depends": info.depends,
                                         "p2p_symbols": sorted(s for s in info.undefined
                                                               if s.startswith(P2P_PREFIX))}
    if problems:
        raise BuildError(f"the GPUDirect modules do not fit nvidia.ko and the kernel: {problems[0]}",
                         hint="\n".join(problems[1:10]) or None)
    return kept, {"compile_key": key, "compiled": compiled, "modules": facts}


def _tail(log_path: Path, limit: int = 12) -> str:
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [ln for ln in lines if "error" in ln.lower()]
    return "\n".join((errors or lines)[-limit:])
