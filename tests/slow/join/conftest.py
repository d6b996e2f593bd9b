"""Session fixtures for the container-runtime tests (see gpunode.py for what is real and what
stands in). One node root with two installed driver versions, one rootfs per image layout and one
mount namespace per session; everything is torn down at session end, also on failure."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeprep import artifact
from nodeprep.sources.debian import DebianArchive

from .criclient import oci_archive
from .gpunode import PROBE_C, PROCFS_INFO, GpuNode, cli, make_rootfs_tar, run, unpack_rootfs, unpacked_deb

V_OLD = "535.216.03"  # Debian's tesla-535 user space (as in tests/slow/node)


def _need(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.fail(f"missing {', '.join(missing)} (scripts/deps/join.apt, scripts/deps/node.apt)")


@pytest.fixture(scope="session")
def cdi_cache(test_cache: Path) -> Path:
    path = test_cache / "cdi"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def versions(real_build) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """(first, second): the real build's version, then Debian's tesla-535."""
    return real_build.driver_version, V_OLD


@pytest.fixture(scope="session")
def gpu_node(  # type: ignore[no-untyped-def]
    real_build, test_cache: Path, cdi_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GpuNode]:
    _need("podman", "unshare", "nsenter", "mmdebstrap", "gcc", "mknod")
    from nodeprep.builder.userspace import build_userspace
    from tests.slow.node.helpers import build_stub_kmod

    work = tmp_path_factory.mktemp("gpunode")
    tar = make_rootfs_tar(cdi_cache)
    root = unpack_rootfs(tar, work / "node", Path("/bin/true"), layout="debian")
    # the node's python3, which the CDI hook program runs with (`runtime` checks it is there); the
    # namespace runs the program with the host's, the same Debian 12 build
    shutil.copy2("/usr/bin/python3.11", root / "usr/bin/python3.11")
    (root / "usr/bin/python3").symlink_to("python3.11")
    # the second version: user space from Debian's tesla-535 packages + kmod-shaped stand-ins
    archive = DebianArchive(test_cache)
    node_cache = test_cache / "node"
    built = node_cache / "artifacts"
    built.mkdir(parents=True, exist_ok=True)
    store = artifact.LocalStore(work / "store")
    us, usm = build_userspace(archive, V_OLD, built)
    store.publish(us, usm)
    km, kmm = build_stub_kmod(archive, node_cache, V_OLD, built)
    store.publish(km, kmm)
    for src, version, kernel in (
        (real_build.store, V_OLD, None),
        (real_build.store, real_build.driver_version, real_build.kernel_release),
    ):
        if version == V_OLD:
            src, kernel = store.path, str(kmm.kernel_release)
        r = cli("install", "--store", str(src), "--driver", version, "--kernel", kernel, "--root", str(root),
                "--no-load")
        assert r.returncode == 0, r.stderr
    r = cli("activate", real_build.driver_version, "--root", str(root), "--no-load")
    assert r.returncode == 0, r.stderr
    gpus = root / "proc/driver/nvidia/gpus/0000:00:1e.0"
    gpus.mkdir(parents=True)
    (gpus / "information").write_text(PROCFS_INFO)
    (root / "etc/nodeprep").mkdir(parents=True)
    (root / "etc/nodeprep/node.yaml").write_text(
        f'driver:\n  version: "{real_build.driver_version}"\n  store: {real_build.store}\n'
    )
    r = cli("runtime", "--root", str(root))
    assert r.returncode == 0, r.stderr

    (work / "probe.c").write_text(PROBE_C)
    run(["gcc", "-O2", "-o", work / "probe", work / "probe.c"])
    node = GpuNode(root=root, work=work)
    # glibc built for /lib64 (Debian 12's libc6-amd64, an i386 package) for the RHEL/UBI-like image
    # (from bookworm itself: any glibc 2.36 build will do, and the security mirror's i386 index has
    # been seen mid-sync, "File has unexpected size", which would fail the whole fixture)
    glibc = unpacked_deb(test_cache, "libc6-amd64", arch="i386", security=False)
    for layout in ("debian", "lib64"):
        node.rootfs[layout] = unpack_rootfs(tar, work / f"rootfs-{layout}", work / "probe", layout=layout,
                                            lib64_glibc=glibc)
    try:
        node.start()
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="module")
def cri_images(gpu_node: GpuNode, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The OCI archive of every rootfs of the node, for a CRI test module's containerd to import."""
    return oci_archive(gpu_node.rootfs, tmp_path_factory.mktemp("images"))
