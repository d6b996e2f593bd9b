"""Small real node artifacts for tests of install/activate: user spaces of real shared objects
with NVIDIA's sonames (compiled here, tests/unit/join/conftest.py), kmods whose nvidia.ko is an
object file with a real `.modinfo` section, packed into a real directory store."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nodeprep import artifact, runner
from tests.support import rawartifact as ra
from tests.unit.join.conftest import build_payload, node_python

KERNEL = "6.1.0-28-amd64"


def tree(top: Path) -> dict[str, str]:
    """Everything under `top`, links not followed: path -> link text, 'dir' or file sha256."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for n in dirnames + filenames:
            p = Path(dirpath, n)
            rel = str(p.relative_to(top))
            if rel.endswith("var/lib/nodeprep/lock"):
                continue
            kind = "link:" + os.readlink(p) if p.is_symlink() else "dir" if p.is_dir() else ""
            out[rel] = kind or artifact.sha256_file(p)
    return out


def userspace_artifact(work: Path, version: str, store: Path, *, drop: tuple[str, ...] = (),
                       supported: bytes | None = None) -> Path:
    """The user space of `version` (with `supported` as its share/supported-gpus.json when given)."""
    payload = build_payload(work, version)
    if supported is not None:
        (payload / "share").mkdir(exist_ok=True)
        (payload / "share" / "supported-gpus.json").write_bytes(supported)
    for pattern in drop:
        for p in (payload / "lib64").glob(pattern):
            p.unlink()
    manifest = artifact.Manifest(kind="userspace", driver_version=version, arch="amd64", os="debian-12",
                                 input_digest="0" * 64, inputs={})
    path, _ = artifact.pack(payload, manifest, store)
    return path


def standin_kmod(
    work: Path, version: str, store: Path, kernel: str = KERNEL
) -> tuple[Path, artifact.Manifest]:
    """A kmod artifact whose nvidia.ko is an object file compiled here with a real `.modinfo`
    section (vermagic of `kernel`, version): real modinfo reads it like a module; no code inside."""
    work.mkdir(parents=True, exist_ok=True)
    src = work / "modinfo.c"
    info = f"version={version}\\0vermagic={kernel} SMP preempt mod_unload modversions \\0name=nvidia"
    src.write_text(f'__attribute__((section(".modinfo"), used, aligned(1))) '
                   f'static const char modinfo[] = "{info}";\n')
    ko = work / "nvidia.ko"
    cc = runner.which("cc") or runner.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stand-in module")
    runner.run([cc, "-c", "-o", ko, src], timeout=60)
    members = [ra.file(f"modules/{kernel}/nvidia.ko", ko.read_bytes())]
    manifest = ra.manifest_for(members, kind="kmod", version=version, kernel=kernel)
    return ra.write(store / manifest.name, members, manifest), manifest


def standin_store(work: Path, store: Path, version: str, kernels: tuple[str, ...] = (KERNEL,)) -> Path:
    """A directory store with the user space of `version` and a stand-in kmod for each kernel."""
    store.mkdir(parents=True, exist_ok=True)
    us = userspace_artifact(work / "us", version, store)
    found = [(us, artifact.read_manifest(us))]
    for kernel in kernels:
        found.append(standin_kmod(work / f"ko-{kernel}", version, store, kernel))
    return ra.store_with(store, found)


def standin_image_root(tmp_path: Path, version: str = "535.309.01") -> tuple[Path, Path]:
    """(store, root): a store of small real artifacts of `version` (tmp_path/store) and an image root
    (tmp_path/root) with the kernel's module directory, /etc/nodeprep, ld.so.conf and the python3 the
    CDI hook program runs with."""
    store = standin_store(tmp_path / "work", tmp_path / "store", version)
    root = tmp_path / "root"
    (root / "lib/modules" / KERNEL).mkdir(parents=True)
    (root / "etc/nodeprep").mkdir(parents=True)
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    node_python(root)
    return store, root


def gpu_list_store(work: Path, store: Path, lists: dict[str, bytes], kernel: str = KERNEL) -> Path:
    """A directory store with, for each version in `lists`, its user space carrying that
    supported-gpus.json and a stand-in kmod for `kernel`: what nodeprep.node.branch chooses among."""
    store.mkdir(parents=True, exist_ok=True)
    found = []
    for version, supported in lists.items():
        us = userspace_artifact(work / f"us-{version}", version, store, supported=supported)
        found += [(us, artifact.read_manifest(us)),
                  standin_kmod(work / f"ko-{version}", version, store, kernel)]
    return ra.store_with(store, found)
