"""The live path (root /) inside a booted VM: Debian 12's real kernel (linux-image of the store's kernel
release) boots under qemu with a Debian rootfs (python3 + kmod + nodeprep) as its initramfs, into
which the test installed and activated two driver versions with --root beforehand. Inside, the init
script runs `nodeprep load-modules` (real modprobe through the updates/nodeprep links and depmod's
index) and `nodeprep doctor` against the running kernel, then switches the user space without
reloading, which doctor must report as the driver/library version mismatch.

The modules are the kmod-shaped stand-ins of helpers.py (really compiled for that kernel, with
MODULE_VERSION = driver version): they load without a GPU, register no character device, so no
/dev/nvidia* nodes appear; the full NVIDIA module stops at its PCI probe without a GPU (that part is
the smoke test's, tests/slow/smoke).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from nodeprep.builder.kernelfetch import fetch_kernel
from nodeprep.sources.debian import DebianArchive

from .helpers import REPO, V_NEW, V_OLD, NodeStore, cli, run

pytestmark = pytest.mark.slow

PACKAGES = (
    "kmod,python3,python3-click,python3-yaml,python3-requests,python3-zstandard,python3-jinja2,"
    "python3-jsonschema,python3-tomli-w"
)
INIT = f"""#!/bin/sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin PYTHONPATH=/opt/nodeprep-src
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
np() {{ python3 -m nodeprep.cli "$@"; }}
echo "@@load"; np load-modules --json; echo "@@status load $?"
echo "@@modules"; cut -d' ' -f1 /proc/modules | sort | tr '\\n' ' '; echo
echo "@@version $(cat /sys/module/nvidia/version)"
echo "@@doctor"; np doctor --check module --check kmod --check ldcache --json; echo "@@status doctor $?"
echo "@@switch"; np activate {V_OLD} --no-load --json; echo "@@status switch $?"
echo "@@mismatch"; np doctor --check module --json; echo "@@status mismatch $?"
echo "@@end"
echo o > /proc/sysrq-trigger
"""


@pytest.fixture(scope="session")
def live_tar(node_cache: Path) -> Path:
    tar = node_cache / "debian12-live.tar"
    if not tar.exists():
        tmp = tar.with_suffix(".tmp.tar")
        run(
            ["mmdebstrap", "--quiet", "--variant=minbase", f"--include={PACKAGES}", "bookworm", str(tmp)],
            timeout=1800,
        )
        tmp.rename(tar)
    return tar


def sections(console: str) -> dict[str, str]:
    out: dict[str, str] = {}
    parts = re.split(r"@@(\w+)", console)
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        out[name] = out.get(name, "") + body
    return out


def json_block(text: str) -> dict:
    return json.loads(text[text.index("{") : text.rindex("}") + 1])


def test_load_modules_and_doctor_on_a_booted_kernel(
    node_store: NodeStore, live_tar: Path, test_cache: Path, tmp_path: Path
) -> None:
    if not shutil.which("qemu-system-x86_64"):
        pytest.fail("qemu-system-x86_64 is missing (scripts/deps/smoke.apt)")
    kernel = fetch_kernel(node_store.kernel, archive=DebianArchive(test_cache), cache=test_cache)
    root = tmp_path / "root"
    root.mkdir()
    with tarfile.open(live_tar) as t:
        t.extractall(root, filter="fully_trusted")
    args = ("--store", str(node_store.path), "--kernel", node_store.kernel, "--root", str(root))
    assert cli("install", "--driver", V_OLD, *args).returncode == 0
    r = cli("install", "--driver", V_NEW, *args, "--activate")
    assert r.returncode == 0, r.stderr
    (root / "opt/nodeprep-src").mkdir(parents=True)
    shutil.copytree(
        REPO / "nodeprep", root / "opt/nodeprep-src/nodeprep", ignore=shutil.ignore_patterns("__pycache__")
    )
    (root / "init").write_text(INIT)
    os.chmod(root / "init", 0o755)
    image = tmp_path / "initrd.cpio"
    # the initramfs leaves out what the checks here never open (NVVM, PTX JIT, GSP firmware: ~170 MB
    # per version) to keep it small; the tree on disk is untouched
    find = [
        "find",
        ".",
        "(",
        "-name",
        "libnvidia-nvvm.so.*",
        "-o",
        "-name",
        "libnvidia-ptxjitcompiler.so.*",
        "-o",
        "-name",
        "gsp_*.bin",
        ")",
        "-path",
        "./opt/nvidia/*",
        "-prune",
        "-o",
        "-print",
    ]
    files = subprocess.run(find, cwd=root, capture_output=True, check=True).stdout
    with open(image, "wb") as out:
        subprocess.run(["cpio", "-o", "-H", "newc", "--quiet"], cwd=root, input=files, stdout=out, check=True)
    # software emulation: nested KVM on the CI machines hangs in early boot
    argv = [
        "qemu-system-x86_64",
        "-accel",
        "tcg",
        "-smp",
        "1",
        "-m",
        "2048",
        "-nographic",
        "-no-reboot",
        "-nodefaults",
        "-serial",
        "stdio",
        "-nic",
        "none",
        "-kernel",
        str(kernel.vmlinuz),
        "-initrd",
        str(image),
        "-append",
        "console=ttyS0 panic=-1 quiet loglevel=3 rdinit=/init",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=600)
    console = proc.stdout.replace("\r", "")
    assert "@@end" in console, console[-3000:]
    s = sections(console)

    status = dict(re.findall(r"^@@status (\w+) (\d+)", console, flags=re.M))
    assert status == {"load": "0", "doctor": "0", "switch": "0", "mismatch": "1"}, console[-3000:]
    load = json_block(s["load"])
    assert load["modules"] == ["nvidia", "nvidia-uvm", "nvidia-modeset"]
    assert load["created"] == []  # the stand-ins register no character device
    assert {"nvidia", "nvidia_uvm", "nvidia_modeset"} <= set(s["modules"].split())
    assert s["version"].split()[0] == V_NEW

    doctor = json_block(s["doctor"])
    checks = {c["name"]: c for c in doctor["checks"]}
    assert doctor["ok"] is True, doctor
    assert checks["module"]["message"] == f"kernel module {V_NEW} matches the active user space"
    assert checks["kmod"]["message"] == f"{V_NEW} has modules for the running kernel {node_store.kernel}"
    assert f"/opt/nvidia/{V_NEW}/lib64/libcuda.so.{V_NEW}" in checks["ldcache"]["message"]

    switched = json_block(s["switch"])
    assert switched["version"] == V_OLD and switched["changed"] is True

    mismatch = json_block(s["mismatch"])
    assert mismatch["ok"] is False
    msg = mismatch["checks"][0]["message"]
    assert "driver/library version mismatch" in msg and V_NEW in msg and V_OLD in msg
