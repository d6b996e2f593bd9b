"""An image prepared with `--root` works on its own (#28): a Debian 12 rootfs (mmdebstrap, cached,
with python3 and nodeprep's Python dependencies; nodeprep in it as the nodeprep_install role puts
it) gets a driver (`install --root`, store inside the image) and its CDI spec (`runtime --root`);
then, inside a chroot of that tree (nothing of this checkout bound into it), the CDI hook refuses and
admits containers and the kernel hook installs the modules for a kernel installed later; finally a
podman container starts with the spec, its hook run from the image's program. The driver is the
small real stand-in of tests/support/standin.py; no GPU (stand-in device nodes, gpunode.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from nodeprep.runtime.hookprogram import HOOK_PATH
from tests.slow.node.test_kernel_hook import CHROOT_ENV, put_nodeprep
from tests.support.standin import KERNEL, standin_store
from tests.support.testhosts import debian_rootfs

from .gpunode import PROCFS_INFO, REPO, GpuNode, cli, make_rootfs_tar, unpack_rootfs

pytestmark = pytest.mark.slow

VERSION = "535.309.01"  # supports CUDA 12.2
LATER = "6.1.0-99-amd64"
LIBCUDA = "/usr/lib/x86_64-linux-gnu/libcuda.so.1"  # a kernel installed in the image after it was made


def chroot(root: Path, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["chroot", str(root), *argv], capture_output=True, text=True, env=CHROOT_ENV,
                          input=stdin, timeout=300)


def cdi_hook_in_image(root: Path, env: list[str]) -> subprocess.CompletedProcess[str]:
    """The spec's hook as the runtime runs it, but inside the image: a bundle under the image's /tmp."""
    bundle = root / "tmp/bundle"
    bundle.mkdir(parents=True, exist_ok=True)
    (bundle / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "process": {"env": env},
                                                     "root": {"path": "/tmp/bundle/rootfs"}}))
    spec = (root / "etc/cdi/nvidia.yaml").read_text()
    assert f"path: {HOOK_PATH}" in spec
    return chroot(root, HOOK_PATH, "--driver", VERSION, stdin=json.dumps({"bundle": "/tmp/bundle"}))


def test_an_image_made_with_root_runs_its_hooks_itself(test_cache: Path, tmp_path: Path) -> None:
    root = debian_rootfs(test_cache, tmp_path / "image")
    put_nodeprep(root)
    store = standin_store(tmp_path / "work", root / "srv/drivers", VERSION, kernels=(KERNEL, LATER))
    r = cli("install", "--store", str(store), "--driver", VERSION, "--kernel", KERNEL, "--root", str(root),
            "--activate", "--no-load")
    assert r.returncode == 0, r.stderr
    assert "is not recorded" not in r.stderr and "kernel hooks call" not in r.stderr
    gpu = root / "proc/driver/nvidia/gpus/0000:00:1e.0"  # what the booted node's driver would show
    gpu.mkdir(parents=True)
    (gpu / "information").write_text(PROCFS_INFO)
    (root / "etc/nodeprep").mkdir()
    (root / "etc/nodeprep/node.yaml").write_text(f'driver:\n  version: "{VERSION}"\n  store: /srv/drivers\n')
    r = cli("runtime", "--root", str(root))
    assert r.returncode == 0, r.stderr
    # nothing written into the image names this machine's checkout or interpreter
    written = [root / "etc/cdi/nvidia.yaml", root / HOOK_PATH.lstrip("/"),
               root / "var/lib/nodeprep/state.json", root / "etc/kernel/postinst.d/nodeprep",
               root / "etc/kernel/postrm.d/nodeprep"]
    for path in written:
        text = path.read_text()
        assert str(REPO) not in text and ".venv" not in text and str(tmp_path) not in text, path
    assert json.loads(written[2].read_text())["kernel_hook"]["store"] == "/srv/drivers"

    # the CDI hook, inside the image: the image's python3 and the program alone
    refused = cdi_hook_in_image(root, ["NVIDIA_REQUIRE_CUDA=cuda>=12.4"])
    assert refused.returncode == 1, refused.stderr
    assert "nodeprep: container refused: NVIDIA_REQUIRE_CUDA requires CUDA >=12.4" in refused.stderr
    admitted = cdi_hook_in_image(root, ["NVIDIA_REQUIRE_CUDA=cuda>=12.2"])
    assert admitted.returncode == 0 and admitted.stderr == "", admitted.stderr

    # the kernel hook, inside the image: a kernel installed later gets the active driver's modules
    # from the recorded store (/srv/drivers, in the image)
    (root / f"lib/modules/{LATER}/kernel").mkdir(parents=True)
    hook = chroot(root, "/etc/kernel/postinst.d/nodeprep", LATER, f"/boot/vmlinuz-{LATER}")
    assert hook.returncode == 0
    assert f"installed the NVIDIA {VERSION} modules for kernel {LATER}" in hook.stdout + hook.stderr, hook
    assert (root / f"opt/nvidia/{VERSION}/modules/{LATER}/nvidia.ko").is_file()

    # a container started with the image's spec, its hook run from the image's program
    work = tmp_path / "node"
    work.mkdir()
    node = GpuNode(root=root, work=work)
    node.rootfs["debian"] = unpack_rootfs(make_rootfs_tar(test_cache / "cdi"), work / "rootfs",
                                          Path("/bin/true"), layout="debian")
    try:
        node.start()
        ok = node.podman_run("debian", "test -c /dev/nvidia0 && test -e " + LIBCUDA,
                             env={"NVIDIA_REQUIRE_CUDA": "cuda>=12.2"})
        assert ok.returncode == 0, ok.stderr
        no = node.podman_run("debian", "true", env={"NVIDIA_REQUIRE_CUDA": "cuda>=12.4"})
        assert no.returncode != 0 and "container refused" in no.stderr, no.stderr
    finally:
        node.stop()
