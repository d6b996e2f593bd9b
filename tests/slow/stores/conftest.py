"""The registry every store test shares: the session's real build pushed once (see
test_oci_registry.py for what is real); and a second registry whose blobs are served by nginx
behind redirects (test_oci_redirect.py)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodeprep import artifact
from tests.slow.node.helpers import cli
from tests.support.nginx import Nginx
from tests.support.registry import Registry, start_redirecting_registry, write_auth_file

REPO_NAME = "gpu/nvidia-drivers"


@dataclass(frozen=True)
class Published:
    registry: Registry
    location: str
    auth: Path
    index_digest: str
    version: str
    kernel: str
    kmod: artifact.IndexEntry
    userspace: artifact.IndexEntry


def push_real_build(real_build, registry: Registry, work: Path) -> Published:  # type: ignore[no-untyped-def]
    """`nodeprep artifacts push` of the session's real build to `registry` (credentials and CA as a
    node gets them); what a node needs to pull it back."""
    auth = write_auth_file(work / "config.json", registry.host)
    location = registry.url(REPO_NAME)
    r = cli("artifacts", "push", str(real_build.store), location, "--registry-auth", str(auth),
            "--ca-file", str(registry.ca), "--json")
    assert r.returncode == 0, r.stderr
    entries = artifact.LocalStore(real_build.store).entries()
    kmod = artifact.find(entries, "kmod", real_build.driver_version, kernel_release=real_build.kernel_release)
    us = artifact.find(entries, "userspace", real_build.driver_version)
    if kmod is None or us is None:
        pytest.fail(f"the real build's store lacks the kmod or the user space: {real_build.store}")
    return Published(registry, location, auth, json.loads(r.stdout)["index"],
                     real_build.driver_version, real_build.kernel_release, kmod, us)


@pytest.fixture(scope="session")
def published(real_build, oci_registry: Registry,  # type: ignore[no-untyped-def]
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Published]:
    yield push_real_build(real_build, oci_registry, tmp_path_factory.mktemp("oci-client"))
    # the staging stores build-driver/build-matrix made for this session's registry (its port is
    # new each session, so nothing later reuses them)
    shutil.rmtree(Path(real_build.cache) / "oci-publish" / oci_registry.host.replace(":", "_"),
                  ignore_errors=True)


@dataclass(frozen=True)
class Redirected:
    """The session's real build pushed to a registry whose blob GETs redirect to nginx."""

    published: Published
    nginx: Nginx


@pytest.fixture(scope="session")
def redirected(real_build, tmp_path_factory: pytest.TempPathFactory  # type: ignore[no-untyped-def]
               ) -> Iterator[Redirected]:
    work = tmp_path_factory.mktemp("oci-redirect")
    registry, web = start_redirecting_registry(work / "registry")
    with registry, web:
        yield Redirected(push_real_build(real_build, registry, work), web)
