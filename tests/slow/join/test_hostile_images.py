"""Hostile container images against nodeprep's hooks through real starts (#35): podman 4.3 with runc
1.1.5 (Debian 12), for nodeprep's CDI spec hook and the CUDA gate from hooks.d, and containerd 1.7's
CRI path for the gate from the handlers' base spec. No GPU: the node is gpunode.py's (the real 535
build active, stand-in device nodes); the attacks are real programs in the images.

Each image tries to run code as root on the node through the hooks: an LD_PRELOAD library (the
NVIDIA CVE-2025-23266 pattern) and a fake libexpat through LD_LIBRARY_PATH (both from the image,
reached as /proc/self/cwd/... since a runtime starts hooks in the rootfs), PATH, PYTHONPATH and
GCONV_PATH into the image, an /usr/sbin/ldconfig of the image's own, and an ld.so.conf naming
/proc/1/root/... (before pivot_root the container's PID 1 is runc's init, whose root is the node's).
A canary the libraries write is a file of the node outside every rootfs; each test asserts it stays
absent and that a GPU container still starts, sees the driver and is refused when its CUDA is too
new. A control start of the gate through a hooks.d entry without `env` (how nodeprep wrote it before)
shows the canary does get written when a hook inherits the container's environment.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeprep.runtime import ocihooks

from .gpunode import GpuNode, make_rootfs_tar, unpack_rootfs
from .test_cuda_gate_podman import CLAIM_UID, DRA_KIND, dra_spec, start

pytestmark = pytest.mark.slow

EVIL_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void owned(void) {
    int fd = open(CANARY, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
        char line[128];
        int n = snprintf(line, sizeof line, "uid %d pid %d\n", (int)getuid(), (int)getpid());
        write(fd, line, n);
        close(fd);
    }
}
int foo(void) { return 1; }
"""
EVIL_SCRIPT = "#!/bin/sh\necho \"$0 $*\" >> {canary}\n"
HOSTILE_ENV = {
    "LD_PRELOAD": "/proc/self/cwd/x.so",
    "LD_LIBRARY_PATH": "/proc/self/cwd/evil-lib",
    "PATH": "/proc/self/cwd/evil-bin:/usr/bin:/bin",
    "PYTHONPATH": "/proc/self/cwd/evil-py",
    "GCONV_PATH": "/proc/self/cwd/evil-gconv",
}
TOO_NEW = {"NVIDIA_REQUIRE_CUDA": "cuda>=99.0"}


def compile_lib(src: Path, out: Path, soname: str, canary: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-shared", "-fPIC", f"-DCANARY=\"{canary}\"", f"-Wl,-soname,{soname}",
                    "-o", out, src], check=True, timeout=120)


def new_image(node: GpuNode, cdi_cache: Path, name: str) -> tuple[Path, Path | None]:
    """(the Debian image `name`'s rootfs, the attack library's source to build into it), the source
    None when the image was made already in this session."""
    rootfs = node.work / f"rootfs-{name}"
    if rootfs.is_dir():
        return rootfs, None
    unpack_rootfs(make_rootfs_tar(cdi_cache), rootfs, node.work / "probe", layout="debian")
    src = node.work / "evil.c"
    src.write_text(EVIL_C)
    return rootfs, src


@pytest.fixture(scope="module")
def canary(gpu_node: GpuNode) -> Path:
    """The file the images' code writes when it runs: in a node folder no rootfs has."""
    folder = gpu_node.work / "canary-folder"
    folder.mkdir(exist_ok=True)
    return folder / "written"


@pytest.fixture(scope="module")
def hostile(gpu_node: GpuNode, cdi_cache: Path, canary: Path) -> str:
    """The Debian image with an LD_PRELOAD library at its root, a libexpat.so.1 of its own in
    evil-lib/, programs named like every tool the hooks start in evil-bin/, a python package and a
    gconv-modules of its own; registered as gpu_node.rootfs['hostile']."""
    rootfs, src = new_image(gpu_node, cdi_cache, "hostile")
    if src is not None:
        compile_lib(src, rootfs / "x.so", "x.so", canary)
        compile_lib(src, rootfs / "evil-lib/libexpat.so.1", "libexpat.so.1", canary)
        (rootfs / "evil-bin").mkdir()
        for name in ("ldconfig", "unshare", "chroot", "python3", "nvidia-cdi-hook"):
            (rootfs / "evil-bin" / name).write_text(EVIL_SCRIPT.format(canary=canary))
            (rootfs / "evil-bin" / name).chmod(0o755)
        (rootfs / "evil-py/encodings").mkdir(parents=True)
        (rootfs / "evil-py/encodings/__init__.py").write_text(f"open({str(canary)!r}, 'a').write('py\\n')\n")
        (rootfs / "evil-gconv").mkdir()
        (rootfs / "evil-gconv/gconv-modules").write_text("module  INTERNAL  EVIL//  /x.so  1\n")
    gpu_node.rootfs["hostile"] = rootfs
    return "hostile"


@pytest.fixture(scope="module")
def own_ldconfig(gpu_node: GpuNode, cdi_cache: Path, canary: Path) -> tuple[str, Path]:
    """The Debian image with its own libcuda.so.1 (a real shared object of that soname, in the
    multiarch folder: the hook then rebuilds the ld cache), an /usr/sbin/ldconfig that writes the
    canary and a mark in the image, and an ld.so.conf.d entry naming /proc/1/root/<a node folder
    holding a library without its soname link>; (its name, that node folder)."""
    rootfs, src = new_image(gpu_node, cdi_cache, "own-ldconfig")
    node_lib = gpu_node.work / "node-lib"
    if src is not None:
        compile_lib(src, rootfs / "usr/lib/x86_64-linux-gnu/libcuda.so.1", "libcuda.so.1", canary)
        compile_lib(src, node_lib / "libfoo.so.1.0", "libfoo.so.1", canary)
        tool = rootfs / "usr/sbin/ldconfig"
        tool.unlink()
        tool.write_text(EVIL_SCRIPT.format(canary=canary) + "echo ran > /image-ldconfig-ran\n")
        tool.chmod(0o755)
        (rootfs / "etc/ld.so.conf.d/zz-node.conf").write_text(f"/proc/1/root{node_lib}\n")
    gpu_node.rootfs["own-ldconfig"] = rootfs
    return "own-ldconfig", node_lib


@pytest.fixture
def claim(gpu_node: GpuNode, versions: tuple[str, str]) -> Iterator[None]:
    spec = gpu_node.root / "etc/cdi" / f"k8s.gpu.nvidia.com-claim_{CLAIM_UID}.json"
    spec.write_text(json.dumps(dra_spec(versions[0])))
    try:
        yield
    finally:
        spec.unlink(missing_ok=True)


def assert_untouched(canary: Path) -> None:
    assert not canary.exists(), f"the image ran code on the node: {canary.read_text()!r}"


def test_podman_hostile_environment_reaches_no_hook(
    gpu_node: GpuNode, versions: tuple[str, str], hostile: str, canary: Path, claim: None
) -> None:
    # nodeprep's CDI spec: its hook runs as root before pivot_root; the container still starts
    ok = gpu_node.podman_run(hostile, "ls /dev/nvidia0; readlink /usr/lib/x86_64-linux-gnu/libcuda.so.1; "
                             "echo started", env=HOSTILE_ENV)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.split() == ["/dev/nvidia0", f"/opt/nvidia/{versions[0]}/lib64/libcuda.so.1", "started"]
    refused = gpu_node.podman_run(hostile, "echo started", env={**HOSTILE_ENV, **TOO_NEW})
    assert refused.returncode != 0 and "nodeprep: container refused: NVIDIA_REQUIRE_CUDA" in refused.stderr
    # the CUDA gate from hooks.d: a DRA claim's GPU, and a container without a GPU
    rootfs = gpu_node.rootfs[hostile]
    gated = start(gpu_node, rootfs, HOSTILE_ENV, script="ls /dev/nvidia0; echo started")
    assert gated.returncode == 0 and gated.stdout.split() == ["/dev/nvidia0", "started"], gated.stderr
    refused = start(gpu_node, rootfs, {**HOSTILE_ENV, **TOO_NEW})
    assert refused.returncode != 0 and "nodeprep: container refused: NVIDIA_REQUIRE_CUDA" in refused.stderr
    plain = start(gpu_node, rootfs, HOSTILE_ENV, gpu=False)
    assert plain.returncode == 0 and plain.stdout.strip() == "started", plain.stderr
    assert_untouched(canary)


def test_control_a_hook_without_env_runs_the_image_code_as_root(
    gpu_node: GpuNode, hostile: str, canary: Path
) -> None:
    """The gate's hooks.d entry as nodeprep wrote it before #35 (no `env`), in a hooks folder of its
    own: runc starts it with the container's environment and the image's LD_PRELOAD library runs in
    the node's python3, as root (uid 0), in the node's mount namespace; with LD_LIBRARY_PATH the
    image's libexpat.so.1 is what the node's python3 loads (this one lacks python's symbols: the
    start fails on them)."""
    hooks = gpu_node.work / "hooks-without-env"
    hooks.mkdir(exist_ok=True)
    doc = json.loads(ocihooks.render_hooks_d())
    del doc["hook"]["env"]
    (hooks / ocihooks.HOOK_NAME).write_text(json.dumps(doc))
    argv: list[object] = [*gpu_node.podman_base(), "--hooks-dir", hooks, "run", "--rm", "--network", "none",
                          "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]

    def start_with(name: str) -> subprocess.CompletedProcess[str]:
        return gpu_node.ns([*argv, "--env", f"{name}={HOSTILE_ENV[name]}", "--rootfs",
                            gpu_node.rootfs[hostile], "true"], check=False)

    try:
        r = start_with("LD_PRELOAD")
        assert canary.exists(), (r.returncode, r.stderr)
        assert canary.read_text().startswith("uid 0 ")
    finally:
        canary.unlink(missing_ok=True)
    r = start_with("LD_LIBRARY_PATH")
    assert r.returncode != 0 and "/usr/bin/python3: undefined symbol: XML_" in r.stderr, r.stderr


def test_podman_the_image_ldconfig_never_runs_and_proc_1_root_is_not_reached(
    gpu_node: GpuNode, versions: tuple[str, str], own_ldconfig: tuple[str, Path], canary: Path
) -> None:
    name, node_lib = own_ldconfig
    rootfs = gpu_node.rootfs[name]
    before = sorted(p.name for p in node_lib.iterdir())
    r = gpu_node.podman_run(name, "probe libcuda.so.1; echo started")
    assert r.returncode == 0, r.stderr
    path, _ = r.stdout.split()[1:3]
    assert path == f"/opt/nvidia/{versions[0]}/lib64/libcuda.so.1", r.stdout  # first in the rebuilt cache
    assert r.stdout.split()[-1] == "started"
    assert not (rootfs / "image-ldconfig-ran").exists()
    assert sorted(p.name for p in node_lib.iterdir()) == before  # no libfoo.so.1, no aux-cache there
    assert b"libfoo" not in (rootfs / "etc/ld.so.cache").read_bytes()
    refused = gpu_node.podman_run(name, "echo started", env=TOO_NEW)
    assert refused.returncode != 0 and "nodeprep: container refused" in refused.stderr
    assert_untouched(canary)


@pytest.fixture(scope="module")
def gated_cri(  # type: ignore[no-untyped-def]
    gpu_node: GpuNode, versions: tuple[str, str], hostile: str, test_cache: Path,
    tmp_path_factory: pytest.TempPathFactory,
):
    """containerd 1.7 (Debian 13) with the gate in its handlers' base spec, its images holding the
    hostile one."""
    from .criclient import Containerd, containerd_bin, cri_modules, oci_archive

    pytest.importorskip("grpc_tools", reason="grpcio-tools (pyproject [test] extras)")
    pods = {"debian": gpu_node.rootfs["debian"]}  # the pod sandboxes' image
    images = oci_archive({**pods, hostile: gpu_node.rootfs[hostile]},
                         tmp_path_factory.mktemp("hostile-images"))
    work = tmp_path_factory.mktemp("containerd-hostile")
    pb, stubs = cri_modules(tmp_path_factory.mktemp("cri-gen-hostile"))
    daemon = Containerd(gpu_node, containerd_bin(test_cache, "debian-13"), work, pb, stubs, gate=True)
    try:
        daemon.start(images)
        yield daemon
    finally:
        daemon.stop()


def test_cri_hostile_environment_reaches_no_gate(
    gated_cri, hostile: str, canary: Path, claim: None  # type: ignore[no-untyped-def]
) -> None:
    import grpc

    sid, sconfig = gated_cri.run_pod("hostile")
    device = f"{DRA_KIND}={CLAIM_UID}"
    code, out = gated_cri.run_container(sid, sconfig, "gpu", hostile, "ls /dev/nvidia0; echo started",
                                        env=HOSTILE_ENV, device=device)
    assert (code, out.split()) == (0, ["/dev/nvidia0", "started"])
    code, out = gated_cri.run_container(sid, sconfig, "plain", hostile, "echo started", env=HOSTILE_ENV,
                                        device=None)
    assert (code, out.strip()) == (0, "started")
    with pytest.raises(grpc.RpcError) as refused:
        gated_cri.run_container(sid, sconfig, "refused", hostile, "echo started",
                                env={**HOSTILE_ENV, **TOO_NEW}, device=device)
    assert "nodeprep: container refused: NVIDIA_REQUIRE_CUDA" in refused.value.details()
    assert_untouched(canary)


def test_compile_tools_are_here() -> None:
    assert shutil.which("gcc"), "gcc builds the images' libraries (scripts/deps/join.apt)"
