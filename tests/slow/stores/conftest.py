"""The registry every store test shares: the session's real build pushed once (see
test_oci_registry.py for what is real)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodeprep import artifact
from tests.slow.node.helpers import cli
from tests.support.registry import Registry, write_auth_file

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


@pytest.fixture(scope="session")
def published(real_build, oci_registry: Registry,  # type: ignore[no-untyped-def]
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Published]:
    work = tmp_path_factory.mktemp("oci-client")
    auth = write_auth_file(work / "config.json", oci_registry.host)
    location = oci_registry.url(REPO_NAME)
    r = cli("artifacts", "push", str(real_build.store), location, "--registry-auth", str(auth),
            "--ca-file", str(oci_registry.ca), "--json")
    assert r.returncode == 0, r.stderr
    entries = artifact.LocalStore(real_build.store).entries()
    kmod = artifact.find(entries, "kmod", real_build.driver_version, kernel_release=real_build.kernel_release)
    us = artifact.find(entries, "userspace", real_build.driver_version)
    if kmod is None or us is None:
        pytest.fail(f"the real build's store lacks the kmod or the user space: {real_build.store}")
    yield Published(oci_registry, location, auth, json.loads(r.stdout)["index"],
                    real_build.driver_version, real_build.kernel_release, kmod, us)
    # the staging stores build-driver/build-matrix made for this session's registry (its port is
    # new each session, so nothing later reuses them)
    shutil.rmtree(Path(real_build.cache) / "oci-publish" / oci_registry.host.replace(":", "_"),
                  ignore_errors=True)


