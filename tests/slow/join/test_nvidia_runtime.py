"""The `nvidia` runtime for real (issue 26, item 4): containerd 1.7 (Debian 13) and 2.1 (Debian sid),
each with nodeprep's drop-in
naming NVIDIA's real nvidia-container-runtime v1.20.0 (tests/support/nvidia.py), in CDI mode by the
config.toml `nodeprep runtime --root` wrote. A pod run with the runtime handler `nvidia` (what a
RuntimeClass `nvidia` asks for) and a container with NVIDIA_VISIBLE_DEVICES=all and no CDI device in
its CRI request: the runtime alone turns that into nodeprep's spec's devices and mounts, then runs
runc. The container sees the active version's libraries and the device nodes; after `nodeprep
activate` of the other version a new container sees that one, after rollback the first again. The
same container in a pod of the default handler (runc) gets nothing: the injection is the runtime's.

The runtime reads the node root's config.toml through XDG_CONFIG_HOME (the root's /etc), set on
containerd and so on its shims; everything else is as in test_cri_containerd.py (criclient.py,
gpunode.py, conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeprep.profile import Runtime
from tests.support import nvidia

from .criclient import Containerd, containerd_bin, cri_modules, oci_archive
from .gpunode import INSPECT, GpuNode, Seen, cli
from .test_cdi_podman import assert_sees

pytestmark = pytest.mark.slow

CONFIG = "etc/nvidia-container-runtime/config.toml"
# -s, not -e: a podman test before this one ran containers with --rootfs on the same image tree, and
# runc leaves an empty file where it bind-mounted libcuda.so.1 (a mount point, not the library)
NOTHING = ("if [ -e /dev/nvidia0 ] || [ -s /usr/lib/x86_64-linux-gnu/libcuda.so.1 ]; then echo seen; "
           "else echo neither; fi")


@pytest.fixture(scope="module", params=[("debian-13", "1.7"), ("debian-sid", "2.1")], ids=["1.7", "2.1"])
def daemon(  # type: ignore[no-untyped-def]
    request, gpu_node: GpuNode, test_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Containerd, str]]:
    os_name, major_minor = request.param
    reason = nvidia.skip_reason()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("grpc_tools", reason="grpcio-tools (pyproject [test] extras)")
    binary = nvidia.nvidia_binaries(test_cache)["nvidia-container-runtime"]
    work = tmp_path_factory.mktemp(f"nvidia-runtime-{major_minor}")
    # a setting of the admin's own (the runtime's debug log) that nodeprep's rewrite must keep
    config = gpu_node.root / CONFIG
    config.write_text(f'[nvidia-container-runtime]\ndebug = "{work}/runtime.log"\nlog-level = "debug"\n')
    r = cli("runtime", "--root", str(gpu_node.root))
    assert r.returncode == 0, r.stderr
    assert f"{work}/runtime.log" in config.read_text() and 'mode = "cdi"' in config.read_text()
    images = oci_archive({"debian": gpu_node.rootfs["debian"]}, tmp_path_factory.mktemp("images"))
    pb, stubs = cri_modules(tmp_path_factory.mktemp("cri-gen"))
    ctd = Containerd(gpu_node, containerd_bin(test_cache, os_name), work, pb, stubs,
                     runtime=Runtime(nvidia_runtime_path=str(binary)),
                     env={"XDG_CONFIG_HOME": str(gpu_node.root / "etc")})
    try:
        ctd.start(images)
        yield ctd, major_minor
    finally:
        ctd.stop()


def _inspect(daemon: Containerd, pod: tuple[str, object], name: str) -> Seen:
    code, out = daemon.run_container(pod[0], pod[1], name, "debian", INSPECT,
                                     env={"NVIDIA_VISIBLE_DEVICES": "all"}, device=None)
    log = daemon.work / "runtime.log"
    assert code == 0, out + (log.read_text()[-3000:] if log.exists() else "")
    version = daemon.version().runtime_version.lstrip("v")
    print(f"containerd {version}, handler nvidia, {name}:\n{out}")  # shown with -s (docs/join.md)
    return Seen.parse(out)


def test_nvidia_handler_injects_the_active_version_and_follows_switch_and_rollback(
    daemon: tuple[Containerd, str], gpu_node: GpuNode, versions: tuple[str, str]
) -> None:
    ctd, major_minor = daemon
    first, second = versions
    root = str(gpu_node.root)
    assert ctd.version().runtime_version.lstrip("v").startswith(f"{major_minor}.")
    plain = ctd.run_pod("plain")
    code, out = ctd.run_container(plain[0], plain[1], "plain", "debian", NOTHING,
                                  env={"NVIDIA_VISIBLE_DEVICES": "all"}, device=None)
    assert (code, out.strip()) == (0, "neither"), out

    pod = ctd.run_pod("gpu", handler="nvidia")
    assert_sees(_inspect(ctd, pod, "first"), gpu_node, first, "debian")
    try:
        r = cli("activate", second, "--root", root, "--no-load")
        assert r.returncode == 0, r.stderr
        assert_sees(_inspect(ctd, pod, "second"), gpu_node, second, "debian")
        r = cli("rollback", "--root", root, "--no-load")
        assert r.returncode == 0, r.stderr
        assert_sees(_inspect(ctd, pod, "rolled-back"), gpu_node, first, "debian")
    finally:
        cli("activate", first, "--root", root, "--no-load")  # the session's node stays on `first`
