"""Entry points on a LIVE root (issue 26): nodeprep runs inside a Debian 12 host (the test hosts' cached
rootfs, tests/support/testhosts.py, with python3 and nodeprep's dependencies from Debian), chrooted,
with no --root: the node's own / as on a booted node (the running kernel's release, the host's
ldconfig and depmod). The driver user space is the stand-in of test_node_nvidia_stack.py (nvidia-smi
exits 9 as without a GPU, libnvidia-ml says which version answered). NVIDIA's real consumers: the GPU
Operator's validator in its container with the host's root at /host (CTR, a bind mount of the host's
root in a private mount namespace; `-c driver --host-root /host`: it must run the active root's
nvidia-smi, exit 9, not fail to find it) and nvidia-ctk in the host (`cdi generate --mode
management`, driver root /). Switch and rollback move what they find, uninstall removes the links
(the host has no systemd: its daemon-reload is skipped, said so), and a dpkg package's nvidia-smi
refuses the activation with one line naming the package."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support import nvidia
from tests.support import rawartifact as ra
from tests.support.standin import standin_kmod
from tests.support.testhosts import debian_rootfs

from .helpers import REPO
from .test_node_nvidia_stack import NOT_FOUND, TOOLS, V1, V2, _userspace

pytestmark = pytest.mark.slow

PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.fixture(scope="module")
def live(test_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The host's root, with nodeprep's sources at /opt/nodeprep-src, a store of both versions (kmods
    for the running kernel) at /srv/store and NVIDIA's consumers at /consumers."""
    stack = nvidia.nvidia_binaries_or_skip(test_cache)
    work = tmp_path_factory.mktemp("live")
    root = debian_rootfs(test_cache, work / "host")
    shutil.copytree(REPO / "nodeprep", root / "opt/nodeprep-src/nodeprep",
                    ignore=shutil.ignore_patterns("__pycache__"))
    kernel = os.uname().release
    (root / f"lib/modules/{kernel}/kernel").mkdir(parents=True, exist_ok=True)
    store = root / "srv/store"
    store.mkdir(parents=True)
    found = []
    for v in (V1, V2):
        found += [_userspace(work / f"us-{v}", v, store), standin_kmod(work / f"ko-{v}", v, store, kernel)]
    ra.store_with(store, found)
    nvidia.copy_into_root(root, stack["nvidia-ctk"], "/consumers/nvidia-ctk")
    ctr = work / "ctr"  # the validator's container
    (ctr / "host").mkdir(parents=True)
    nvidia.copy_into_root(ctr, stack["nvidia-validator"], "/usr/bin/nvidia-validator")
    nvidia.copy_into_root(ctr, Path(shutil.which("chroot") or "/usr/sbin/chroot"), "/usr/bin/chroot")
    nvidia.dev_null(ctr)
    if not (root / "dev/null").exists():
        nvidia.dev_null(root)
    for name, minor in (("nvidiactl", 255), ("nvidia0", 0)):  # what nvidia-ctk's management mode lists
        os.mknod(root / "dev" / name, 0o020666, os.makedev(195, minor))
    return root


def inside(root: Path, *argv: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["chroot", str(root), *argv], capture_output=True, text=True, timeout=timeout,
                          env={"PATH": PATH, "PYTHONPATH": "/opt/nodeprep-src", "LANG": "C.UTF-8"})


def nodeprep(root: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    done = inside(root, "python3", "-m", "nodeprep.cli", *args)
    if ok:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def validator(root: Path) -> str:
    ctr = root.parent / "ctr"
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         'mount --bind "$1" "$2/host" && exec chroot "$2" /usr/bin/nvidia-validator -c driver '
         "--host-root /host -o /validations", "sh", root, ctr],
        capture_output=True, text=True, timeout=120, env={"PATH": PATH})
    assert done.returncode != 0  # no GPU, no cluster to fall back to
    return done.stdout + done.stderr


def ctk_spec(root: Path, name: str) -> dict:  # type: ignore[type-arg]
    done = inside(root, "/consumers/nvidia-ctk", "cdi", "generate", "--mode", "management",
                  "--output", f"/tmp/{name}.yaml")
    assert done.returncode == 0, done.stderr
    for tool in TOOLS:
        assert f"Could not locate {tool}" not in done.stderr
    return yaml.safe_load((root / f"tmp/{name}.yaml").read_text())  # type: ignore[no-any-return]


def sees(root: Path, version: str) -> None:
    out = validator(root)
    assert "No pre-installed driver detected on the host: exit status 9" in out, out  # ran nvidia-smi
    assert NOT_FOUND not in out
    spec = ctk_spec(root, version)
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    lib = f"/opt/nvidia/{version}/lib64"
    assert mounts[f"{lib}/libnvidia-ml.so.{version}"] == f"{lib}/libnvidia-ml.so.{version}"
    for tool in TOOLS:  # found on the standard path, through the link nodeprep made
        assert os.path.realpath(root / mounts[f"/usr/bin/{tool}"].lstrip("/")) == \
            f"{root}/opt/nvidia/{version}/bin/{tool}"
    assert os.readlink(root / "usr/bin/nvidia-smi") == "../../opt/nvidia/current/bin/nvidia-smi"


def test_validator_and_ctk_find_the_active_version_on_a_live_root(live: Path) -> None:
    root = live
    nodeprep(root, "install", "--store", "/srv/store", "--driver", V1)
    assert NOT_FOUND in validator(root)  # installed, not active: not where NVIDIA looks
    nodeprep(root, "install", "--store", "/srv/store", "--driver", V1, "--activate", "--no-load")
    sees(root, V1)
    nodeprep(root, "install", "--store", "/srv/store", "--driver", V2, "--activate", "--no-load")
    sees(root, V2)
    nodeprep(root, "rollback", "--no-load")
    sees(root, V1)
    done = nodeprep(root, "uninstall", "--json")
    assert "systemctl not found: `systemctl daemon-reload` skipped" in json.loads(done.stdout)["notes"]
    for tool in TOOLS:
        assert not os.path.lexists(root / f"usr/bin/{tool}")
    assert not (root / "opt/nvidia").exists()
    assert NOT_FOUND in validator(root)


def test_a_dpkg_packages_nvidia_smi_refuses_the_activation(live: Path) -> None:
    root = live
    info = root / "var/lib/dpkg/info/nvidia-smi.list"  # as Debian's nvidia-smi package lists it
    info.write_text("/.\n/usr\n/usr/bin\n/usr/bin/nvidia-smi\n")
    smi = root / "usr/bin/nvidia-smi"
    smi.write_bytes(nvidia.EXIT_9_ELF)
    try:
        done = nodeprep(root, "install", "--store", "/srv/store", "--driver", V1, "--activate", "--no-load",
                        ok=False)
        assert done.returncode == 2, done.stderr
        lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and "belongs to package nvidia-smi (dpkg)" in lines[0], done.stderr
        assert "Traceback" not in done.stderr
        assert smi.read_bytes() == nvidia.EXIT_9_ELF and not os.path.lexists(root / "opt/nvidia/current")
    finally:
        info.unlink()
        smi.unlink()
        nodeprep(root, "uninstall")
