"""A small kmod artifact packed and published by nodeprep.artifact, for the `artifacts` command tests."""

from __future__ import annotations

from pathlib import Path

from nodeprep import artifact


def publish_kmod(store: Path, tmp: Path) -> Path:
    """Packs a kmod of 535.309.01 for 6.1.0-56-amd64 (one nvidia.ko of 16 KiB) under `tmp` and
    publishes it into `store`; returns the published artifact's path."""
    payload = tmp / "payload"
    (payload / "modules" / "6.1.0-56-amd64").mkdir(parents=True)
    (payload / "modules" / "6.1.0-56-amd64" / "nvidia.ko").write_bytes(bytes(range(256)) * 64)
    manifest = artifact.Manifest(
        kind="kmod",
        driver_version="535.309.01",
        arch="amd64",
        os="debian-12",
        input_digest="f" * 64,
        inputs={"x.deb": "0" * 64},
        flavour="proprietary",
        kernel_release="6.1.0-56-amd64",
        vermagic="6.1.0-56-amd64 SMP",
    )
    path, manifest = artifact.pack(payload, manifest, tmp / "out")
    artifact.LocalStore(store).publish(path, manifest)
    return store / path.name
