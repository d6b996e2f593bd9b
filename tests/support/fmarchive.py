"""NVIDIA's Fabric Manager archive, packed here in its real layout around stand-in binaries.

No Fabric Manager archive is reachable from the tests (NVIDIA publishes it only as a redistributable
download), so this packs `fabricmanager-linux-x86_64-<version>-archive.tar.xz` with the members the
real one has (the layout NVIDIA's redist archives of 5xx carry, as packaging recipes install them:
bin/nv-fabricmanager, bin/nvswitch-audit, bin/nvidia-fabricmanager-start.sh, lib/libnvfm.so.1 and its
libnvfm.so link, etc/fabricmanager.cfg and fabricmanager_multinode.cfg, share/nvidia/nvswitch/*_topology,
systemd/nvidia-fabricmanager.service, include/nv_fm_agent.h, nv_fm_types.h, LICENSE), whose programs
are stand-ins compiled here (they print a version line and exit), whose library is a real shared object
with the SONAME libnvfm.so.1 and no code of NVIDIA's, and whose configuration carries the keys of
NVIDIA's default fabricmanager.cfg. A test that uses it says so.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from nodeprep import runner
from tests.support.elfsynth import compile_so

CONFIG = """\
# Fabric Manager configuration (stand-in carrying the keys of NVIDIA's default file)
LOG_LEVEL=4
LOG_FILE_NAME=/var/log/fabricmanager.log
LOG_APPEND_TO_LOG=1
LOG_FILE_MAX_SIZE=1024
LOG_USE_SYSLOG=0
DAEMONIZE=1
BIND_INTERFACE_IP=127.0.0.1
STARTING_TCP_PORT=16000
FABRIC_MODE=0
FABRIC_MODE_RESTART=0
STATE_FILE_NAME=/var/tmp/fabricmanager.state
FM_CMD_BIND_INTERFACE=127.0.0.1
FM_CMD_PORT_NUMBER=6666
FM_STAY_RESIDENT_ON_FAILURES=0
ACCESS_LINK_FAILURE_MODE=0
TRUNK_LINK_FAILURE_MODE=0
NVSWITCH_FAILURE_MODE=0
ABORT_CUDA_JOBS_ON_FM_EXIT=1
TOPOLOGY_FILE_PATH=/usr/share/nvidia/nvswitch
DATABASE_PATH=/usr/share/nvidia/nvswitch
"""


def _program(work: Path, name: str, version: str) -> bytes:
    cc = runner.which("gcc") or runner.which("cc")
    if cc is None:
        pytest.skip("no C compiler for the stand-in programs")
    src = work / f"{name}.c"
    line = f"Fabric Manager version is : {version} (stand-in)"
    src.write_text('#include <stdio.h>\nint main(void) { puts("' + line + '"); return 0; }\n')
    out = work / name
    runner.run([cc, "-o", out, src], timeout=120)
    return out.read_bytes()


def pack(work: Path, version: str, *, arch: str = "x86_64", top: str | None = None,
         extra: dict[str, bytes] | None = None, soname: str = "libnvfm.so.1") -> Path:
    """`work`/fabricmanager-linux-<arch>-<version>-archive.tar.xz; `top`: another top directory,
    `extra`: more members (path below the top -> bytes), `soname`: the library's."""
    work.mkdir(parents=True, exist_ok=True)
    name = f"fabricmanager-linux-{arch}-{version}-archive"
    top = top or name
    lib = compile_so(work / "libnvfm.so.1", soname).read_bytes()
    files: dict[str, tuple[bytes, int]] = {
        "LICENSE": (b"NVIDIA Software License Agreement (stand-in text)\n", 0o644),
        "bin/nv-fabricmanager": (_program(work, "nv-fabricmanager", version), 0o755),
        "bin/nvswitch-audit": (_program(work, "nvswitch-audit", version), 0o755),
        "bin/nvidia-fabricmanager-start.sh": (b"#!/bin/bash\n# stand-in of NVIDIA's start script\n", 0o755),
        "etc/fabricmanager.cfg": (CONFIG.encode(), 0o644),
        "etc/fabricmanager_multinode.cfg": (CONFIG.encode(), 0o644),
        "include/nv_fm_agent.h": (b"/* stand-in */\n", 0o644),
        "include/nv_fm_types.h": (b"/* stand-in */\n", 0o644),
        "lib/libnvfm.so.1": (lib, 0o755),
        "share/nvidia/nvswitch/dgxa100_hgxa100_topology": (b"stand-in topology A100\n", 0o644),
        "share/nvidia/nvswitch/dgxh100_hgxh100_topology": (b"stand-in topology H100\n", 0o644),
        "share/nvidia/nvswitch/dgxh800_hgxh800_topology": (b"stand-in topology H800\n", 0o644),
        "systemd/nvidia-fabricmanager.service": (b"[Unit]\nDescription=NVIDIA fabric manager service\n",
                                                 0o644),
        **{k: (v, 0o644) for k, v in (extra or {}).items()},
    }
    out = work / f"{name}.tar.xz"
    with tarfile.open(out, "w:xz") as t:
        for d in ("", "bin", "etc", "include", "lib", "share", "share/nvidia", "share/nvidia/nvswitch",
                  "systemd"):
            info = tarfile.TarInfo(f"{top}/{d}".rstrip("/"))
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            t.addfile(info)
        for rel, (data, mode) in files.items():
            info = tarfile.TarInfo(f"{top}/{rel}")
            info.size, info.mode = len(data), mode
            t.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo(f"{top}/lib/libnvfm.so")
        link.type, link.linkname = tarfile.SYMTYPE, "libnvfm.so.1"
        t.addfile(link)
    return out
