"""NVIDIA's own discovery finds the driver nodeprep activated (issue 26, item 1).

The consumers are NVIDIA's real binaries (tests/support/nvidia.py, skipped without
NODEPREP_NVIDIA_BIN): the GPU Operator's validator, nvidia-ctk, gpu-feature-discovery and the device
plugin, each run the way it runs on a node, against a root that the real `nodeprep install
--activate` made. There is no GPU here, so the driver's user space is a stand-in that answers as
NVIDIA's does without one: `nvidia-smi` is a static ELF that exits 9, `libnvidia-ml` returns
NVML_ERROR_DRIVER_NOT_LOADED from nvmlInit and says which version answered (a Debian-built user space
needs a driver build this tier does not share with these tests). Everything else (artifacts, store,
install, the links, `current`, the ld cache) is the product's.

The node root is ROOT = CTR/host: the validator runs chrooted into CTR with the root at /host, as in
its container (it looks for `/host/usr/bin/nvidia-smi` and runs `chroot /host nvidia-smi`; CTR holds
the host's `chroot` with its libraries and a /dev/null). GFD and the device plugin use driver root
`/`: they run chrooted into ROOT, which holds glibc as every distribution does.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from nodeprep import artifact, runner
from tests.support import nvidia
from tests.support import rawartifact as ra
from tests.support.standin import KERNEL, standin_kmod
from tests.unit.join.conftest import build_payload

from .helpers import cli

pytestmark = pytest.mark.slow

V1, V2 = "535.216.03", "535.309.01"
TOOLS = ("nvidia-smi", "nvidia-persistenced", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server")
NOT_FOUND = "No pre-installed driver detected on the host: failed to find an executable 'nvidia-smi'"


@pytest.fixture(scope="module")
def stack(test_cache: Path) -> dict[str, Path]:
    return nvidia.nvidia_binaries_or_skip(test_cache)


def _userspace(work: Path, version: str, store: Path) -> tuple[Path, artifact.Manifest]:
    """A user space whose nvidia-smi and libnvidia-ml answer like NVIDIA's without a GPU."""
    payload = build_payload(work, version)
    src = work / "nvml.c"
    src.write_text(nvidia.NVML_STANDIN_C)
    runner.run(["cc", "-shared", "-fPIC", f'-DDRIVER_VERSION="{version}"', "-Wl,-soname,libnvidia-ml.so.1",
                "-o", payload / "lib64" / f"libnvidia-ml.so.{version}", src], timeout=60)
    for tool in TOOLS:
        (payload / "bin" / tool).write_bytes(nvidia.EXIT_9_ELF)
        (payload / "bin" / tool).chmod(0o755)
    manifest = artifact.Manifest(kind="userspace", driver_version=version, arch="amd64", os="debian-12",
                                 input_digest="0" * 64, inputs={})
    return artifact.pack(payload, manifest, store)


@pytest.fixture(scope="module")
def store(stack: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("stack")
    store = work / "store"
    store.mkdir()
    found = []
    for v in (V1, V2):
        found += [_userspace(work / f"us-{v}", v, store), standin_kmod(work / f"ko-{v}", v, store)]
    return ra.store_with(store, found)


@pytest.fixture
def ctr(stack: dict[str, Path], tmp_path: Path) -> Path:
    """CTR (the validator's container) with ROOT = CTR/host: a root with glibc and Debian's ld.so.conf,
    device nodes for nvidia-ctk, the kubelet's device-plugin folder, GFD and the device plugin."""
    ctr = tmp_path / "ctr"
    root = ctr / "host"
    (root / "etc").mkdir(parents=True)
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (root / "var/lib/kubelet/device-plugins").mkdir(parents=True)
    (root / "tmp").mkdir()
    nvidia.dev_null(root)
    for name, minor in (("nvidiactl", 255), ("nvidia0", 0)):
        os.mknod(root / "dev" / name, 0o020666, os.makedev(195, minor))
    for name in ("gpu-feature-discovery", "nvidia-device-plugin"):
        nvidia.copy_into_root(root, stack[name], f"/consumers/{name}")
    nvidia.copy_into_root(ctr, stack["nvidia-validator"], "/usr/bin/nvidia-validator")
    nvidia.copy_into_root(ctr, Path(runner.which("chroot") or "/usr/sbin/chroot"), "/usr/bin/chroot")
    nvidia.dev_null(ctr)
    return ctr


def nodeprep(*args: str) -> subprocess.CompletedProcess[str]:
    done = cli(*args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def run(argv: list[str | Path], timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([os.fspath(a) for a in argv], capture_output=True, text=True, timeout=timeout,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})


def validator(ctr: Path) -> str:
    done = run(["chroot", ctr, "/usr/bin/nvidia-validator", "-c", "driver", "--host-root", "/host",
                "-o", "/validations"])
    assert done.returncode != 0  # no cluster to fall back to
    return done.stdout + done.stderr


def test_validator_runs_the_active_nvidia_smi(store: Path, ctr: Path) -> None:
    root = ctr / "host"
    nodeprep("install", "--store", str(store), "--driver", V1, "--kernel", KERNEL, "--root", str(root))
    assert NOT_FOUND in validator(ctr)  # installed, not active: not where NVIDIA looks

    nodeprep("install", "--store", str(store), "--driver", V1, "--kernel", KERNEL, "--root", str(root),
             "--activate")
    out = validator(ctr)
    assert "No pre-installed driver detected on the host: exit status 9" in out, out  # ran nvidia-smi
    assert NOT_FOUND not in out


def _ctk(stack: dict[str, Path], root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run([stack["nvidia-ctk"], "cdi", "generate", "--driver-root", root, "--dev-root", root, *args])


def test_nvidia_ctk_finds_every_library_and_tool_of_the_active_version(
        stack: dict[str, Path], store: Path, ctr: Path, tmp_path: Path) -> None:
    root = ctr / "host"
    for v in (V2, V1):
        nodeprep("install", "--store", str(store), "--driver", v, "--kernel", KERNEL, "--root", str(root))
    nodeprep("activate", V1, "--root", str(root))
    for version in (V1, V2):
        if version == V2:
            nodeprep("activate", V2, "--root", str(root))
        # NVML mode: the library is found where it lives, and it is the one that answered
        nvml = _ctk(stack, root, "--output", str(tmp_path / "nvml.yaml"))
        assert f"Using {root}/opt/nvidia/{version}/lib64/libnvidia-ml.so.{version}" in nvml.stderr
        assert f"stand-in libnvidia-ml {version}: nvmlInit" in nvml.stderr
        assert "failed to initialize NVML: Driver Not Loaded" in nvml.stderr
        # management mode needs no NVML: the whole spec, from the device nodes and the lookups
        spec_file = tmp_path / f"management-{version}.yaml"
        done = _ctk(stack, root, "--mode", "management", "--output", str(spec_file))
        assert done.returncode == 0, done.stderr
        for tool in TOOLS:
            assert f"Could not locate {tool}" not in done.stderr
        spec = yaml.safe_load(spec_file.read_text())
        mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
        lib = f"/opt/nvidia/{version}/lib64"
        assert mounts[f"{lib}/libcuda.so.{version}"] == f"{root}{lib}/libcuda.so.{version}"
        assert mounts[f"{lib}/libnvidia-ml.so.{version}"] == f"{root}{lib}/libnvidia-ml.so.{version}"
        for tool in TOOLS:
            assert os.path.realpath(mounts[f"/usr/bin/{tool}"]) == f"{root}/opt/nvidia/{version}/bin/{tool}"
        assert f"NVIDIA_CTK_LIBCUDA_DIR={lib}" in spec["containerEdits"]["env"]


def _consumer(root: Path, name: str, *args: str) -> str:
    done = run(["chroot", root, f"/consumers/{name}", *args], timeout=60)
    assert done.returncode != 0  # no GPU
    return done.stdout + done.stderr


def test_gfd_and_device_plugin_load_nvml_of_the_active_version(store: Path, ctr: Path) -> None:
    root = ctr / "host"
    for v in (V2, V1):
        nodeprep("install", "--store", str(store), "--driver", v, "--kernel", KERNEL, "--root", str(root))
    nodeprep("activate", V1, "--root", str(root))
    for version, step in ((V1, None), (V2, ("activate", V2)), (V1, ("rollback",))):
        if step:
            nodeprep(*step, "--root", str(root))
        gfd = _consumer(root, "gpu-feature-discovery", "--oneshot", "--use-node-feature-api=false",
                        "-o", "/tmp/gfd")
        assert f"stand-in libnvidia-ml {version}: nvmlInit_v2" in gfd, gfd
        assert "failed to initialize resource manager: Driver Not Loaded" in gfd
        plugin = _consumer(root, "nvidia-device-plugin")
        assert f"stand-in libnvidia-ml {version}: nvmlInit_v2" in plugin, plugin
        assert "Detected platform: nvml" in plugin and "nvml init failed: Driver Not Loaded" in plugin
        assert os.readlink(root / "usr/bin/nvidia-smi") == "../../opt/nvidia/current/bin/nvidia-smi"
        assert os.path.realpath(root / "usr/bin/nvidia-smi") == f"{root}/opt/nvidia/{version}/bin/nvidia-smi"


def test_dra_kubelet_plugin_loads_nvml_of_the_active_version(store: Path, ctr: Path,
                                                             test_cache: Path) -> None:
    """NVIDIA's DRA driver's kubelet plugin (k8s-dra-driver-gpu v25.12.0) with the chart's settings for
    a host driver (`nvidiaDriverRoot: /`; its container sees that root at --container-driver-root,
    here the chroot's /) finds libnvidia-ml of the active version in a nodeprep root and follows
    activate and rollback: as far as a machine without a GPU gets (NVML answers Driver Not Loaded)."""
    plugin = nvidia.optional_binary(test_cache, "gpu-kubelet-plugin")
    if isinstance(plugin, str):
        pytest.skip(plugin)
    root = ctr / "host"
    nvidia.copy_into_root(root, plugin, "/consumers/gpu-kubelet-plugin")
    (root / "var/lib/kubelet/plugins_registry").mkdir(parents=True)
    # a client configuration is required before anything else; the plugin stops before it calls out
    (root / "kubeconfig").write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
        "current-context: c\n")
    for v in (V2, V1):
        nodeprep("install", "--store", str(store), "--driver", v, "--kernel", KERNEL, "--root", str(root))
    nodeprep("activate", V1, "--root", str(root))
    args = ("--node-name", "node-1", "--kubeconfig", "/kubeconfig", "--nvidia-driver-root", "/",
            "--container-driver-root", "/", "--cdi-root", "/var/run/cdi", "--nvidia-cdi-hook-path",
            "/usr/bin/nvidia-cdi-hook", "--image-name", "nvcr.io/nvidia/k8s-dra-driver-gpu:v25.12.0")
    for version, step in ((V1, None), (V2, ("activate", V2)), (V1, ("rollback",))):
        if step:
            nodeprep(*step, "--root", str(root))
        out = _consumer(root, "gpu-kubelet-plugin", *args)
        assert f"stand-in libnvidia-ml {version}: nvmlInit_v2" in out, out
        assert "Failed to initialize NVML: Driver Not Loaded" in out, out
    nodeprep("uninstall", "--root", str(root))
    out = _consumer(root, "gpu-kubelet-plugin", *args)
    assert 'failed to locate driver libraries: error locating "libnvidia-ml.so.1"' in out, out
