"""nodeprep's CDI spec carries what NVIDIA's `nvidia-ctk cdi generate` mounts for the same root (issue 26).

The oracle is NVIDIA's real nvidia-ctk (tests/support/nvidia.py; skipped without NODEPREP_NVIDIA_BIN)
in `--mode management`, which needs no NVML and lists everything from the device nodes and its own
lookups under `--driver-root`/`--dev-root`. The root is made by the real `nodeprep install --activate`
from a directory store: a user space of real shared objects under NVIDIA's names and sonames (compute,
cuda-gdb's libcudadebugger, the GL/EGL/GLX/Vulkan vendor libraries), tools, GSP firmware; device
nodes, a MIG capability node, persistenced's socket and nvidia-cdi-hook itself on the node's PATH.
nodeprep's spec is the one `nodeprep runtime --root` writes. Every mount and device node in NVIDIA's
spec must be in nodeprep's, or be one of EXCLUDED (docs/join.md says why); every link NVIDIA's
`create-symlinks` makes must exist in nodeprep's containers too (mounted under that name, or linked
by nodeprep's hook to a file of the library folder its spec mounts).
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from nodeprep import artifact, runner
from nodeprep.runtime import cdi
from tests.support import nvidia
from tests.support import rawartifact as ra
from tests.support.fixtures import NVIDIA_SMI
from tests.support.standin import KERNEL, standin_kmod
from tests.unit.join.conftest import _compile_so, build_payload, node_python

from .gpunode import cli

pytestmark = pytest.mark.slow

V = "535.309.01"
# what the Debian packages of a full driver put beside the compute libraries (name -> soname)
MORE_LIBS = {
    "libcudadebugger.so": "libcudadebugger.so.1",
    "libGLX_nvidia.so": "libGLX_nvidia.so.0",
    "libEGL_nvidia.so": "libEGL_nvidia.so.0",
    "libnvidia-glcore.so": None,
    "libnvidia-eglcore.so": None,
    "libnvidia-allocator.so": "libnvidia-allocator.so.1",
    "libnvidia-opticalflow.so": "libnvidia-opticalflow.so.1",
    "libnvidia-vulkan-producer.so": None,
    "libnvidia-egl-gbm.so": None,
}
# In NVIDIA's spec, not in nodeprep's, on purpose (docs/join.md, "What the spec carries"): the graphics
# loaders' configuration files its NVML-mode graphics discovery mounts (toolkit
# internal/discover/graphics.go). They lie outside the versioned driver root (the OS's, not the
# driver's: a driver switch must not leave a container mounting another install's files) and the
# user space artifact carries none. Management mode (this test's oracle) does not look for them.
EXCLUDED = {
    "/etc/vulkan/icd.d/nvidia_icd.json", "/usr/share/vulkan/icd.d/nvidia_icd.json",
    "/etc/vulkan/implicit_layer.d/nvidia_layers.json", "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
    "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
    "/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
}
# NVIDIA's hooks nodeprep's spec does not call as hooks of their own, on purpose: nodeprep's own hook
# links the libraries into the loaders' default directories (every name create-symlinks makes
# included), rebuilds the cache only when needed, and runs enable-cuda-compat itself for an image
# with CUDA compat libraries (`--nvidia-cdi-hook`).
EXCLUDED_HOOKS = {"update-ldcache", "create-symlinks", "enable-cuda-compat"}


@pytest.fixture(scope="module")
def stack(test_cache: Path) -> dict[str, Path]:
    return nvidia.nvidia_binaries_or_skip(test_cache)


@pytest.fixture(scope="module")
def node(stack: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root with the driver installed and activated by nodeprep, and what a GPU node has in /dev,
    /run and on its PATH."""
    work = tmp_path_factory.mktemp("parity")
    payload = build_payload(work / "us", V)
    for base, soname in MORE_LIBS.items():
        _compile_so(payload / "lib64" / f"{base}.{V}", soname or f"{base}.{V}", work)
    nvml = work / "nvml.c"  # nvidia-ctk links libnvidia-ml at start: a library that answers "no driver"
    nvml.write_text(nvidia.NVML_STANDIN_C)
    runner.run(["cc", "-shared", "-fPIC", f'-DDRIVER_VERSION="{V}"', "-Wl,-soname,libnvidia-ml.so.1", "-o",
                payload / "lib64" / f"libnvidia-ml.so.{V}", nvml], timeout=60)
    store = work / "store"
    store.mkdir()
    manifest = artifact.Manifest(kind="userspace", driver_version=V, arch="amd64", os="debian-12",
                                 input_digest="0" * 64, inputs={})
    ra.store_with(store, [artifact.pack(payload, manifest, store), standin_kmod(work / "ko", V, store)])
    root = work / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    node_python(root)  # the node's python3, which runs nodeprep's hook program
    nvidia.dev_null(root)
    for name, minor in (("nvidiactl", 255), ("nvidia0", 0), ("nvidia-modeset", 254)):
        os.mknod(root / "dev" / name, 0o020666, os.makedev(195, minor))
    (root / "dev/nvidia-caps").mkdir()
    os.mknod(root / "dev/nvidia-caps/nvidia-cap1", 0o020400, os.makedev(234, 1))
    (root / "run/nvidia-persistenced").mkdir(parents=True)
    with socket.socket(socket.AF_UNIX) as s:  # persistenced is running
        s.bind(str(root / "run/nvidia-persistenced/socket"))
    done = cli("install", "--store", str(store), "--driver", V, "--kernel", KERNEL, "--root", str(root),
               "--activate")
    assert done.returncode == 0, done.stderr
    hook = root / "usr/bin/nvidia-cdi-hook"
    hook.write_bytes(stack["nvidia-cdi-hook"].read_bytes())
    hook.chmod(0o755)
    return root


def nvidia_spec(stack: dict[str, Path], root: Path, out: Path) -> dict:  # type: ignore[type-arg]
    argv = [stack["nvidia-ctk"], "cdi", "generate", "--mode", "management", "--driver-root", root,
            "--dev-root", root, "--nvidia-cdi-hook-path", "/usr/bin/nvidia-cdi-hook", "--output", out]
    done = subprocess.run([os.fspath(a) for a in argv], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(out.read_text())


def nodeprep_spec(root: Path, tmp_path: Path) -> dict:  # type: ignore[type-arg]
    profile = tmp_path / "node.yaml"
    profile.write_text(yaml.safe_dump({"driver": {"version": V}}))
    done = cli("runtime", "--profile", str(profile), "--root", str(root), "--nvidia-smi-xml",
               str(NVIDIA_SMI / "a10g_515.105.01.xml"))
    assert done.returncode == 0, done.stderr
    return yaml.safe_load((root / "etc/cdi/nvidia.yaml").read_text())


def _edits(spec: dict) -> list[dict]:  # type: ignore[type-arg]
    return [spec["containerEdits"], *(d["containerEdits"] for d in spec["devices"])]


def _hooks(spec: dict) -> dict[str, list[str]]:  # type: ignore[type-arg]
    return {h["args"][1]: h["args"][2:] for h in spec["containerEdits"].get("hooks", [])
            if h["args"][0] == "nvidia-cdi-hook"}


def test_every_mount_device_and_link_of_nvidia_ctk_is_in_nodeprep_spec(
        stack: dict[str, Path], node: Path, tmp_path: Path) -> None:
    theirs = nvidia_spec(stack, node, tmp_path / "nvidia.yaml")
    ours = nodeprep_spec(node, tmp_path)
    root = os.fspath(node)

    def host_file(host: str, prefixed: bool) -> str:
        return os.path.realpath(host if prefixed else root + host)

    our_mounts: dict[str, set[str]] = {}  # real host file -> names it has in the container
    for m in ours["containerEdits"]["mounts"]:
        our_mounts.setdefault(host_file(m["hostPath"], False), set()).add(m["containerPath"])
    folder, links = cdi.library_links(ours)  # the lib64 folder, mounted once; the hook links the names
    assert folder is not None and host_file(folder, False) in our_mounts
    for name, entry in links.items():
        our_mounts.setdefault(host_file(f"{folder}/{entry}", False), set()).add(f"(linked)/{name}")
    missing, excluded = [], []
    their_mounts = theirs["containerEdits"]["mounts"]
    assert len(their_mounts) == 18  # 12 libraries, 4 tools, the firmware and the socket
    for m in their_mounts:
        node_path = m["hostPath"].removeprefix(root)
        real = host_file(m["hostPath"], True)
        if node_path in EXCLUDED:
            assert real not in our_mounts
            excluded.append(node_path)
        elif real not in our_mounts:
            missing.append(node_path)
        elif not m["containerPath"].startswith(f"/opt/nvidia/{V}/"):  # NVIDIA mounts libraries in place
            assert m["containerPath"] in our_mounts[real]
    assert missing == []
    assert set(excluded) <= EXCLUDED
    assert not any(p in EXCLUDED for paths in our_mounts.values() for p in paths)
    names = {Path(p).name for paths in our_mounts.values() for p in paths}
    assert {f"libcudadebugger.so.{V}", "libcudadebugger.so.1", f"libGLX_nvidia.so.{V}",
            "gsp_ga10x.bin", "socket"} <= names

    theirs_nodes = {n["path"] for e in _edits(theirs) for n in e.get("deviceNodes", [])}
    ours_nodes = {n["path"] for e in _edits(ours) for n in e.get("deviceNodes", [])}
    assert {"/dev/nvidia-modeset", "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia0"} <= theirs_nodes
    assert theirs_nodes <= ours_nodes

    their_hooks, our_hooks = _hooks(theirs), _hooks(ours)
    assert set(their_hooks) - EXCLUDED_HOOKS <= set(our_hooks)
    made = {name for name, entry in links.items() if name != entry}  # names that are no file's own
    for link in their_hooks["create-symlinks"][1::2]:
        name = link.partition("::")[2].rpartition("/")[2]
        assert name in names or name in made, link
    assert made == {"libcuda.so", "libnvidia-opticalflow.so", "libGLX_indirect.so.0"}
    assert their_hooks["enable-cuda-compat"] == [f"--host-driver-version={V}"]  # what nodeprep's hook passes
    assert cdi.nvidia_cdi_hook_of(ours) == "/usr/bin/nvidia-cdi-hook"
