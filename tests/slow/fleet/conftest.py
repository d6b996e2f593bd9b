"""Fixtures for the fleet tier: real SSH test hosts (tests/support/testhosts.py), artifact stores
served to them over HTTP from the root-namespace end of their veths, and playbook runs.

Stand-ins, each at one boundary:
- GPU facts come from a recorded `nvidia-smi -q -x` capture (tests/fixtures/nvidia-smi) copied onto each host:
  the test hosts have no GPU.
- The driver stack goes into an image root on each host (IMAGE_ROOT, like `--root` for an image
  build): the hosts run the CI machine's kernel, for which no NVIDIA kmod artifact exists, and the
  library refuses to activate on a live system without modules for the running kernel. Everything
  else (the hosts, sshd, Ansible, the modules, the library, the artifacts, ldconfig, depmod) is real.
- There is no Kubernetes API server, so kube_join runs in dry-run mode (files written, no kubeadm).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import testhosts

REPO = testhosts.REPO
IMAGE_ROOT, CA_PIN, TOKEN = testhosts.IMAGE_ROOT, testhosts.CA_PIN, testhosts.TOKEN
fleet_vars, prepare_host, write_inventory = (
    testhosts.fleet_vars,
    testhosts.prepare_host,
    testhosts.write_inventory,
)


def _require_tools() -> None:
    missing = [t for t in ("mmdebstrap", "ssh", "ssh-keygen", "ip", "ldconfig") if shutil.which(t) is None]
    if missing:
        pytest.skip("fleet test hosts need " + ", ".join(missing) + " (scripts/deps/fleet.apt)")
    try:
        import ansible  # noqa: F401
    except ImportError:
        pytest.skip("ansible-core is not installed (pip install -e .[test])")


@dataclass(frozen=True)
class Store:
    path: Path
    versions: tuple[str, ...]
    kernel: str


@pytest.fixture(scope="session")
def source_snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of this checkout's nodeprep/ package: the controller's source for nodeprep_install, fixed
    for the whole session so repeated runs build the same zipapp."""
    dest = tmp_path_factory.mktemp("source")
    shutil.copytree(REPO / "nodeprep", dest / "nodeprep", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


@pytest.fixture(scope="session")
def site_store(real_build) -> Store:  # type: ignore[no-untyped-def]
    """The shared real build (full NVIDIA 535 kmod for Debian 12's kernel + user space)."""
    if real_build.userspace is None:
        pytest.fail("the shared real build has no user-space artifact")
    return Store(real_build.store, (real_build.driver_version,), real_build.kernel_release)


@pytest.fixture(scope="session")
def upgrade_store(test_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Store:
    """Two driver versions for one Debian 12 kernel, built like the node tests build them
    (tests/slow/node/helpers.py: real user space from Debian's packages, small real-compiled kmods
    named like NVIDIA's), cached under test_cache/node/."""
    from nodeprep import artifact
    from nodeprep.builder.userspace import build_userspace
    from nodeprep.sources.debian import DebianArchive
    from tests.slow.node.helpers import V_NEW, V_OLD, build_stub_kmod

    node_cache = test_cache / "node"
    node_cache.mkdir(parents=True, exist_ok=True)
    archive = DebianArchive(test_cache)
    built = node_cache / "artifacts"
    store = artifact.LocalStore(tmp_path_factory.mktemp("upgrade-store") / "good")
    kernel = ""
    for v in (V_OLD, V_NEW):
        us, usm = build_userspace(archive, v, built)
        store.publish(us, usm)
        km, kmm = build_stub_kmod(archive, node_cache, v, built)
        store.publish(km, kmm)
        kernel = str(kmm.kernel_release)
    return Store(store.path, (V_OLD, V_NEW), kernel)


@pytest.fixture
def fleet3(test_cache: Path, tmp_path: Path) -> Iterator[testhosts.Fleet]:
    """Three fresh SSH test hosts (node1..node3) with an empty image root and a GPU capture each;
    torn down after the test even when it fails."""
    _require_tools()
    with testhosts.fleet(test_cache, tmp_path, 3) as fl:
        for host in fl.hosts:
            prepare_host(host)
        yield fl
