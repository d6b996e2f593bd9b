"""The spec nodeprep writes when NVIDIA's nvidia-cdi-hook is installed, run by podman 4.3 with the real
binary (tests/support/nvidia.py: nvidia-container-toolkit v1.20.0, skipped without NODEPREP_NVIDIA_BIN).

The hook is installed on the node (ROOT/usr/bin, where `nodeprep runtime --root` finds it) and, for
the runtime, at /usr/bin inside the test's own mount namespace (GpuNode.nvidia_cdi_hook). The spec
then has nodeprep's hook call NVIDIA's for what only it does: `enable-cuda-compat` puts an image's
newer CUDA forward-compatibility libraries first (run only for an image that has such libraries),
and nodeprep's hook (requirement check, the library links, the unversioned names applications
dlopen such as libcuda.so included, ld cache rebuilt only when needed) sees that and rebuilds the
cache. containerd's CRI runs of the same spec are in
test_cri_containerd.py. Everything else is as in test_cdi_podman.py (fixtures: conftest.py, gpunode.py)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import nvidia

from .gpunode import INSPECT, GpuNode, Seen, make_rootfs_tar, run, unpack_rootfs, unpacked_deb
from .test_cdi_podman import LIB_DIR, REQUIRE_12_4, active_files, assert_sees

pytestmark = pytest.mark.slow

LINKS = ("for l in /usr/lib/x86_64-linux-gnu/libcuda.so /usr/lib64/libcuda.so; do "
         "[ -L $l ] && echo \"libcuda.so $(readlink $l)\"; done; ")
COMPAT = "libcuda.so.550.54.15"  # a newer driver's CUDA compat library, as CUDA 12.4 images carry


def nvidia_cdi_hook(test_cache: Path) -> Path:
    return nvidia.nvidia_binaries_or_skip(test_cache)["nvidia-cdi-hook"]


@pytest.fixture(scope="module")
def toolkit_spec(gpu_node: GpuNode, test_cache: Path) -> Iterator[dict]:  # type: ignore[type-arg]
    with gpu_node.nvidia_cdi_hook(nvidia_cdi_hook(test_cache)) as spec:
        yield spec


def test_spec_calls_nvidia_hook_only_for_what_nodeprep_does_not(
        toolkit_spec: dict, versions: tuple[str, str]) -> None:  # type: ignore[type-arg]
    (ours,) = toolkit_spec["containerEdits"]["hooks"]  # no params file on this node
    # NVIDIA's hook for enable-cuda-compat, run by nodeprep's for an image with compat libraries
    assert ours["args"][1:7] == ["--driver", versions[0], "--ldconfig", LIB_DIR,  # fast path kept
                                 "--nvidia-cdi-hook", "/usr/bin/nvidia-cdi-hook"]
    assert "libcuda.so=libcuda.so.1" in ours["args"]  # the link create-symlinks made before


@pytest.mark.parametrize("layout", ["debian", "lib64"])
def test_podman_runs_nvidia_hook_and_the_links_load_the_active_driver(
        toolkit_spec: dict, gpu_node: GpuNode, versions: tuple[str, str], cdi_cache: Path,  # type: ignore[type-arg]
        test_cache: Path, layout: str) -> None:
    # a fresh image: the hooks write into the rootfs podman runs (--rootfs)
    lib64 = layout == "lib64"
    glibc = unpacked_deb(test_cache, "libc6-amd64", arch="i386", security=False) if lib64 else None
    gpu_node.rootfs[f"toolkit-{layout}"] = unpack_rootfs(
        make_rootfs_tar(cdi_cache), gpu_node.work / f"rootfs-toolkit-{layout}", gpu_node.work / "probe",
        layout=layout, lib64_glibc=glibc)
    r = gpu_node.podman_run(f"toolkit-{layout}", LINKS + INSPECT + "; probe libcuda.so | sed 's/^/probe /'")
    assert r.returncode == 0, r.stderr
    print(f"podman, NVIDIA's nvidia-cdi-hook, {layout} image:\n{r.stdout}")  # shown with -s (docs/join.md)
    seen = Seen.parse(r.stdout)
    assert_sees(seen, gpu_node, versions[0], layout)  # nothing ran ldconfig: no cache entry
    links = [line.split()[1] for line in r.stdout.splitlines() if line.startswith("libcuda.so ")]
    assert links == [f"/opt/nvidia/{versions[0]}/lib64/libcuda.so.1"]  # made by nodeprep's hook
    ident = active_files(gpu_node, versions[0])["libcuda.so.1"]
    assert seen.probe["libcuda.so"][1] == ident  # what `dlopen("libcuda.so")` loads


def test_podman_cuda_compat_by_nvidia_hook_then_cache_by_nodeprep(
        toolkit_spec: dict, gpu_node: GpuNode, cdi_cache: Path) -> None:  # type: ignore[type-arg]
    """An image with CUDA compat libraries newer than the driver and no ld.so.conf entry for them (as
    NVIDIA's CUDA images ship them): NVIDIA's enable-cuda-compat adds their folder, nodeprep's hook
    sees the cache does not name it and rebuilds it: the compat library is what loads."""
    work = gpu_node.work
    rootfs = unpack_rootfs(make_rootfs_tar(cdi_cache), work / "rootfs-toolkit-compat", work / "probe",
                           layout="debian")
    compat = rootfs / "usr/local/cuda/compat"
    compat.mkdir(parents=True)
    (work / "compat.c").write_text("int cuInit(unsigned int flags) { return flags ? 1 : 0; }\n")
    run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", compat / COMPAT, work / "compat.c"])
    os.symlink(COMPAT, compat / "libcuda.so.1")
    gpu_node.rootfs["toolkit-compat"] = rootfs
    r = gpu_node.podman_run("toolkit-compat", INSPECT + "; ls /etc/ld.so.conf.d | sed 's/^/conf /'")
    assert r.returncode == 0, r.stderr
    seen = Seen.parse(r.stdout)
    assert seen.probe["libcuda.so.1"][0] == "/usr/local/cuda/compat/libcuda.so.1", r.stdout
    confs = [line.split()[1] for line in r.stdout.splitlines() if line.startswith("conf ")]
    assert [c for c in confs if c.startswith("00-")][-1] == "00-nodeprep-nvidia.conf"
    assert any(c.startswith("00-compat-") for c in confs), confs  # written by enable-cuda-compat


def test_refused_container_never_starts(
        toolkit_spec: dict, gpu_node: GpuNode) -> None:  # type: ignore[type-arg]
    refused = gpu_node.podman_run("debian", "echo started", env={"NVIDIA_REQUIRE_CUDA": REQUIRE_12_4})
    assert refused.returncode != 0 and "started" not in refused.stdout
    assert "nodeprep: container refused" in refused.stderr


def test_hook_binary_is_nvidia(test_cache: Path) -> None:
    """The binary the tests run is NVIDIA's own, the version docs/join.md names."""
    out = subprocess.run([nvidia_cdi_hook(test_cache), "--version"], capture_output=True, text=True,
                         timeout=60).stdout
    assert "1.20.0" in out and "5505e2f94d9aaa08561490db974ba3cd676af209" in out


# /proc/driver/nvidia/params as a loaded driver shows it (lines of 580's, its default ModifyDeviceFiles)
PARAMS = "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nDeviceFileUID: 0\nDeviceFileGID: 0\n"


def test_nodeprep_hook_becomes_nvidias_disable_device_node_modification(
        tmp_path: Path, test_cache: Path) -> None:
    """On a node whose driver lets device files be changed (ModifyDeviceFiles: 1), the spec's one hook,
    nodeprep's, ends by becoming NVIDIA's `disable-device-node-modification` (exec: one process for the
    runtime to start, not two), which reads the OCI state nodeprep's hook already read and mounts a
    copy of the params file saying 0 over the container's. The loaded driver is stood in for by the
    test's own mount namespace (a tmpfs over /proc/driver holding the params file); the rootfs holds
    the file the container's procfs would show."""
    import json

    from nodeprep.runtime.files import apply_changes
    from nodeprep.runtime.hookprogram import hook_program

    tool = nvidia_cdi_hook(test_cache)
    changes = hook_program(tmp_path / "node")
    apply_changes(changes)
    rootfs = tmp_path / "rootfs"
    (rootfs / "proc/driver/nvidia").mkdir(parents=True)
    (rootfs / "proc/driver/nvidia/params").write_text(PARAMS)
    (rootfs / "run").mkdir()
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({"root": {"path": str(rootfs)}, "process": {"env": []}}))
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 1,
                                 "bundle": str(bundle)}))
    script = ('set -e; mount -t tmpfs tmpfs /proc/driver; mkdir /proc/driver/nvidia; '
              'printf %s "$PARAMS" > /proc/driver/nvidia/params; '
              '"$HOOK" --driver 580.142 --nvidia-cdi-hook "$TOOL" --disable-device-node-modification '
              '< "$STATE"; '
              'cat "$ROOTFS/proc/driver/nvidia/params"; grep -c " $ROOTFS/proc/driver/nvidia/params " '
              '/proc/self/mountinfo')
    env = {"PATH": os.environ["PATH"], "PARAMS": PARAMS, "HOOK": str(changes[-1].path), "TOOL": str(tool),
           "STATE": str(state), "ROOTFS": str(rootfs)}
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == PARAMS.replace("ModifyDeviceFiles: 1", "ModifyDeviceFiles: 0") + "1\n"
    assert (rootfs / "proc/driver/nvidia/params").read_text() == PARAMS  # a mount of the namespace, gone
