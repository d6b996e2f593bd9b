"""nodeprep's data for containerd's default spec (nodeprep/data/containerd-default-spec.json) is what
the real `ctr oci spec` prints, for containerd 1.6 (Debian 12), 1.7 (Debian 13) and 2.1 (Debian sid),
and what `nodeprep runtime --root` writes for a root whose dpkg status names that version.

The binaries come from Debian's .debs (fetched and unpacked as in test_containerd_versions.py). The
test runs the real `ctr` itself (tests are trusted; nodeprep never runs a node's ctr: issue #35).
Debian's repacked 1.7.24~ds1 links Debian's runtime-spec package and prints ociVersion 1.2.0 where
upstream's 1.7.24 prints 1.1.0 (the data's): the one field allowed to differ.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from nodeprep.profile import Runtime
from nodeprep.runtime import containerd as ctd
from nodeprep.runtime import ocidefault, ocihooks
from nodeprep.runtime.files import apply_changes

from .criclient import containerd_bin

pytestmark = pytest.mark.slow

DEBIAN_OCI_VERSION = {(1, 7): "1.2.0"}  # what Debian's repack prints where it differs from upstream's


@pytest.mark.parametrize("os_name", ["debian-12", "debian-13", "debian-sid"])
def test_data_is_what_the_real_ctr_prints(test_cache: Path, tmp_path: Path, os_name: str) -> None:
    bindir = containerd_bin(test_cache, os_name)
    package = bindir.parent.parent.name.split("_")[1]  # containerd_<version>_amd64
    version = ocidefault.parse_version(package)
    assert version is not None
    real = json.loads(subprocess.run([bindir / "ctr", "oci", "spec"], capture_output=True, text=True,
                                     check=True, timeout=60).stdout)
    ours = ocidefault.spec_for(version)
    assert ours is not None
    if version[:2] in DEBIAN_OCI_VERSION and real["ociVersion"] == DEBIAN_OCI_VERSION[version[:2]]:
        real["ociVersion"] = ours["ociVersion"]
    assert ours == real

    root = tmp_path / "root"
    (root / "etc/containerd").mkdir(parents=True)
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text(
        f"Package: containerd\nStatus: install ok installed\nVersion: {package}\n")
    apply_changes(ctd.plan_containerd(root, Runtime(), gate_hook=ocihooks.gate_hook()))
    written = json.loads((root / "etc/containerd/nodeprep-base-spec.json").read_text())
    assert written == json.loads(ctd.render_base_spec(real, ocihooks.gate_hook()))
