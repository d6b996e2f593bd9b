"""Host facts under --root: os-release and the driver nodeprep installed (artifact manifests written
with nodeprep.artifact.Manifest, the format the install area reads)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from nodeprep.artifact import Manifest
from nodeprep.labels.core import LabelOptions, node_labels

KERNEL = "6.1.0-28-amd64"
DIGEST = "9f2c" + "0" * 56 + "beef"


def install_tree(root: Path, version: str = "550.127.05") -> None:
    base = root / "opt/nvidia" / version
    (base / "modules" / KERNEL).mkdir(parents=True)
    user = Manifest(kind="userspace", driver_version=version, arch="amd64", os="debian-12",
                    input_digest="1" * 64, inputs={})
    kmod = Manifest(kind="kmod", driver_version=version, arch="amd64", os="debian-12", input_digest=DIGEST,
                    inputs={}, flavour="open", kernel_release=KERNEL)
    (base / "manifest.json").write_bytes(user.to_json())
    (base / "modules" / KERNEL / "manifest.json").write_bytes(kmod.to_json())
    os.symlink(version, root / "opt/nvidia/current")


def test_active_driver_labels(empty_root: Path, options: Callable[..., LabelOptions]) -> None:
    install_tree(empty_root)
    (empty_root / "var/lib/nodeprep").mkdir(parents=True)
    (empty_root / "var/lib/nodeprep/state.json").write_text(
        '{"format": 1, "active": "550.127.05", "previous": null, "installed": {}}')
    labels = node_labels(options(cloud="none")).labels
    assert labels["nodeprep.dev/driver-version"] == "550.127.05"
    assert labels["nodeprep.dev/driver-flavour"] == "open"
    assert labels["nodeprep.dev/artifact-digest"] == DIGEST[:32]
    assert labels["nodeprep.dev/os"] == "debian-12"
    assert labels["nodeprep.dev/kernel"] == KERNEL


def test_other_kernel_has_no_kmod_facts(empty_root: Path, options: Callable[..., LabelOptions]) -> None:
    install_tree(empty_root)
    labels = node_labels(options(cloud="none", kernel="6.1.0-99-amd64")).labels
    assert labels["nodeprep.dev/driver-version"] == "550.127.05"
    assert "nodeprep.dev/driver-flavour" not in labels
    assert labels["nodeprep.dev/artifact-digest"] == "1" * 32  # the userspace artifact's


def test_artifact_kernel_and_os_when_the_kernel_has_no_modules(
        empty_root: Path, options: Callable[..., LabelOptions]) -> None:
    """A node on a kernel the active driver has no modules for: the labels name that kernel and,
    apart, the kernel and target OS of the kmod artifact that is installed."""
    install_tree(empty_root)
    labels = node_labels(options(cloud="none", kernel="6.12.94+deb13-amd64")).labels
    assert labels["nodeprep.dev/kernel"] == "6.12.94_deb13-amd64"  # '+' is not allowed in a value
    assert labels["nodeprep.dev/artifact-kernel"] == KERNEL
    assert labels["nodeprep.dev/artifact-os"] == "debian-12"
    labels = node_labels(options(cloud="none", kernel=KERNEL)).labels
    assert labels["nodeprep.dev/artifact-kernel"] == labels["nodeprep.dev/kernel"] == KERNEL


def test_state_without_link_and_garbage_state(empty_root: Path, options: Callable[..., LabelOptions]) -> None:
    state = empty_root / "var/lib/nodeprep/state.json"
    state.parent.mkdir(parents=True)
    state.write_text('{"active": {"driver_version": "535.309.01", "flavour": "proprietary"}}')
    labels = node_labels(options(cloud="none")).labels
    assert (labels["nodeprep.dev/driver-version"], labels["nodeprep.dev/driver-flavour"]) == (
        "535.309.01", "proprietary")
    state.write_text("{not json")
    labels = node_labels(options(cloud="none")).labels
    assert "nodeprep.dev/driver-version" not in labels


def test_os_release_fallback(tmp_path: Path, options: Callable[..., LabelOptions]) -> None:
    root = tmp_path / "r2"
    (root / "usr/lib").mkdir(parents=True)
    (root / "usr/lib/os-release").write_text('NAME="Ubuntu"\nID=ubuntu\nVERSION_ID="22.04"\n')
    assert node_labels(options(root=root, cloud="none")).labels["nodeprep.dev/os"] == "ubuntu-22.04"
