"""fetch_kernel on a merged-/usr kernel package (trixie's linux-image keeps its modules under
usr/lib/modules, compressed): the extracted tree is found through a lib -> usr/lib link and depmod
indexes it. The archive is a stand-in serving .debs built here with dpkg-deb (the Debian archive is the
boundary); the module is a real one (data/vgem.ko, see data/README.md), xz-compressed like Debian's."""

from __future__ import annotations

import shutil
from pathlib import Path

from nodeprep import runner
from nodeprep.builder.kernelfetch import fetch_kernel

REL = "6.12.94+deb13-amd64"


def deb(tmp: Path, name: str, files: dict[str, bytes]) -> Path:
    root = tmp / name
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "DEBIAN").mkdir()
    (root / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: 1\nArchitecture: amd64\nMaintainer: t <t@example.org>\nDescription: t\n")
    out = tmp / f"{name}.deb"
    runner.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", root, out])
    return out


class DebDir:
    """Serves the .debs of one directory by package name (what kernelfetch.Archive needs)."""

    def __init__(self, debs: dict[str, Path]) -> None:
        self.debs = debs

    def download(self, package: str, version: str | None = None) -> Path:
        return self.debs[package]

    def extract(self, deb: Path, dest: Path) -> None:
        runner.run(["dpkg-deb", "-x", deb, dest])


def test_merged_usr_kernel_package_is_found_and_indexed(tmp_path: Path, data: Path) -> None:
    xz = tmp_path / "vgem.ko.xz"
    runner.run(["sh", "-c", f"xz -c {data / 'vgem.ko'} > {xz}"])
    image = deb(tmp_path, f"linux-image-{REL}", {
        f"boot/vmlinuz-{REL}": b"not a kernel",
        f"usr/lib/modules/{REL}/kernel/drivers/gpu/drm/vgem/vgem.ko.xz": xz.read_bytes(),
    })
    headers = deb(tmp_path, f"linux-headers-{REL}", {f"usr/src/linux-headers-{REL}/Module.symvers": b""})
    archive = DebDir({f"linux-image-{REL}": image, f"linux-headers-{REL}": headers})
    kernel = fetch_kernel(REL, archive=archive, cache=tmp_path / "cache")
    assert (kernel.root / "lib").is_symlink() and str((kernel.root / "lib").readlink()) == "usr/lib"
    assert kernel.modules_dir.is_dir() and kernel.vmlinuz.is_file()
    dep = (kernel.modules_dir / "modules.dep").read_text()
    assert dep.startswith("kernel/drivers/gpu/drm/vgem/vgem.ko.xz:")
    shutil.rmtree(tmp_path / "cache")
