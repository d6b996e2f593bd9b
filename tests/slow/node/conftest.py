"""Fixtures for the node tests (see helpers.py for what is real and how it is cached)."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import pytest

from nodeprep import artifact
from nodeprep.builder.userspace import build_userspace
from nodeprep.sources.debian import DebianArchive

from .helpers import V_NEW, V_OLD, NodeStore, build_stub_kmod, run


@pytest.fixture(scope="session")
def node_cache(test_cache: Path) -> Path:
    path = test_cache / "node"
    path.mkdir(parents=True, exist_ok=True)
    return path


def minbase_tar(node_cache: Path, suite: str, name: str) -> Path:
    """A Debian minbase root of `suite` (mmdebstrap), cached as `<name>-minbase.tar`."""
    tar = node_cache / f"{name}-minbase.tar"
    if not tar.exists():
        if not shutil.which("mmdebstrap"):
            pytest.fail("mmdebstrap is missing (scripts/deps/node.apt)")
        tmp = tar.with_suffix(".tmp.tar")
        run(["mmdebstrap", "--quiet", "--variant=minbase", suite, tmp], timeout=1800)
        tmp.rename(tar)
    return tar


@pytest.fixture(scope="session")
def rootfs_tar(node_cache: Path) -> Path:
    """Debian 12 minbase (mmdebstrap), cached as a tarball."""
    return minbase_tar(node_cache, "bookworm", "debian12")


@pytest.fixture(scope="session")
def trixie_tar(node_cache: Path) -> Path:
    """Debian 13 minbase, cached like the Debian 12 one."""
    return minbase_tar(node_cache, "trixie", "debian13")


@pytest.fixture
def rootfs(rootfs_tar: Path, tmp_path: Path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    with tarfile.open(rootfs_tar) as t:
        t.extractall(root, filter="fully_trusted")
    return root


@pytest.fixture(scope="session")
def archive(test_cache: Path) -> DebianArchive:
    return DebianArchive(test_cache)


@pytest.fixture(scope="session")
def node_store(
    archive: DebianArchive, node_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> NodeStore:
    """A LocalStore with user space + kmod artifacts of V_NEW and V_OLD for one Debian 12 kernel."""
    built = node_cache / "artifacts"
    store = artifact.LocalStore(tmp_path_factory.mktemp("store"))
    kernel = vermagic = ""
    for v in (V_NEW, V_OLD):
        us, usm = build_userspace(archive, v, built)
        store.publish(us, usm)
        km, kmm = build_stub_kmod(archive, node_cache, v, built)
        store.publish(km, kmm)
        kernel, vermagic = str(kmm.kernel_release), str(kmm.vermagic)
    return NodeStore(store.path, kernel, vermagic)
