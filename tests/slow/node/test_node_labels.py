"""`nodeprep labels --root` of a root prepared by a real `nodeprep install`: the flavour, kernel and
target OS come from the artifact installed there (its manifests), never from the machine running
nodeprep. The installed artifacts are the real Debian 13 cell (tesla-535 535.274.02 for
6.12.117+deb13-amd64 and its user space; tests/support/realbuild.py, cached in the test cache), the
root the Debian 12 minbase rootfs of these tests — so the root's own OS (its os-release) and the
artifact's target OS differ, and both are labelled."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .helpers import cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trixie(test_cache: Path):  # type: ignore[no-untyped-def]
    from tests.support.realbuild import ensure_cell

    return ensure_cell(test_cache, "debian13-tesla", userspace=True)


def test_labels_of_a_root_name_the_installed_artifact(trixie, rootfs: Path) -> None:
    r = cli("install", "--store", str(trixie.store), "--driver", trixie.driver_version,
            "--flavour", "proprietary", "--kernel", trixie.kernel_release, "--root", str(rootfs),
            "--activate", "--no-load", "--json")
    assert r.returncode == 0, r.stderr
    r = cli("labels", "--root", str(rootfs), "--cloud", "none", "--sysfs-root", str(rootfs / "sys"),
            "--format", "json")
    assert r.returncode == 0, r.stderr
    labels = json.loads(r.stdout)["labels"]
    kernel = trixie.kernel_release.replace("+", "_")  # '+' is not allowed in a label value
    assert labels["nodeprep.dev/driver-flavour"] == "proprietary"
    assert labels["nodeprep.dev/driver-version"] == "535.274.02"
    assert labels["nodeprep.dev/kernel"] == kernel == "6.12.117_deb13-amd64"
    assert labels["nodeprep.dev/kernel"] != os.uname().release.replace("+", "_")
    assert labels["nodeprep.dev/artifact-kernel"] == kernel
    assert labels["nodeprep.dev/artifact-os"] == "debian-13"  # the artifact's target OS
    assert labels["nodeprep.dev/os"] == "debian-12"  # the root's own os-release
    manifest = json.loads((rootfs / "opt/nvidia/535.274.02/modules" / trixie.kernel_release
                           / "manifest.json").read_text())
    assert labels["nodeprep.dev/artifact-digest"] == manifest["input_digest"].split(":")[-1][:32]
    assert manifest["flavour"] == "proprietary" and manifest["os"] == "debian-13"
