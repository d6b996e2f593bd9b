"""The node commands refuse hostile and incomplete artifacts: exit 2, one `error:` line, nothing
written outside the node's own bookkeeping, the active version left active.

Inputs are real: user spaces are real shared objects compiled here with the real sonames
(tests/unit/join/conftest.py builds them), packed with nodeprep.artifact.pack; the hostile kmod is a
real .tar.zst written member by member (tests/support/rawartifact.py). Only the library contents
stand in for NVIDIA's. No kernel module is needed: the refusals happen before modules are read.
"""

from __future__ import annotations

import os
from pathlib import Path

from nodeprep import artifact
from tests.support import rawartifact as ra
from tests.support.clirunner import error_line, invoke
from tests.support.standin import standin_kmod, tree, userspace_artifact
from tests.unit.join.conftest import build_payload, install_driver, unpack_unactivated

V1, V2 = "535.216.03", "535.309.01"
KERNEL = "6.1.0-28-amd64"


def test_install_refuses_the_issue_kmod(tmp_path: Path) -> None:
    """Issue 18: a kmod whose members are `p -> .`, `p/p/…/w -> ../…/TARGET`, then a file `w`, all
    listed in the manifest with matching hashes, was installed with exit 0 and TARGET written."""
    store = tmp_path / "store"
    store.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    target = tmp_path / "outside" / "TARGET"
    target.parent.mkdir()
    us = userspace_artifact(tmp_path / "work", V2, store)
    staging_depth = len((root / "opt/nvidia/.staging-x/modules/.staging-kmod-x").parts) - 1
    deep = "/".join(["p"] * 20 + ["w"])
    members = [ra.link("p", "."), ra.link(deep, "../" * (20 + staging_depth) + str(target).lstrip("/")),
               ra.file("w", b"attacker's bytes\n")]
    kmod_manifest = ra.manifest_for(members, kind="kmod", version=V2, kernel=KERNEL)
    kmod = ra.write(store / kmod_manifest.name, members, kmod_manifest)
    ra.store_with(store, [(us, artifact.read_manifest(us)), (kmod, kmod_manifest)])
    before = tree(tmp_path)

    result = invoke("install", "--store", str(store), "--driver", V2, "--kernel", KERNEL, "--root", str(root))
    assert result.exit_code == 2
    assert "unsafe member 'p'" in error_line(result)
    assert not target.exists()
    after = tree(tmp_path)
    new = sorted(set(after) - set(before))
    assert all(p.startswith(("root/opt", "root/var")) and after[p] == "dir" for p in new), new
    assert {k: v for k, v in after.items() if k in before} == before
    assert [p.name for p in (root / "opt/nvidia").iterdir()] == []

    verified = invoke("artifacts", "verify", str(store))  # the same rules as install
    assert verified.exit_code == 1
    assert f"{kmod.name}: manifest.json: unsafe member 'p': link target '.'" in verified.output


def _node_with_two_versions(tmp_path: Path, *, broken: str) -> Path:
    """A root with V1 installed and active, and V2 unpacked beside it the way install unpacks it,
    but with its libnvidia-ml either missing or not a shared object."""
    root = tmp_path / "root"
    root.mkdir()
    install_driver(root, tmp_path / "w1", V1)
    payload = build_payload(tmp_path / "w2", V2)
    lib = payload / "lib64" / f"libnvidia-ml.so.{V2}"
    if broken == "missing":
        lib.unlink()
    else:
        lib.write_bytes(b"not a shared object\n")
    unpack_unactivated(root, payload, tmp_path / "store", V2)
    return root


def test_activate_refuses_a_user_space_without_libnvidia_ml(tmp_path: Path) -> None:
    root = _node_with_two_versions(tmp_path, broken="missing")
    assert invoke("activate", V1, "--root", str(root)).exit_code == 0  # the complete one activates
    before = tree(root)
    result = invoke("activate", V2, "--root", str(root))
    assert result.exit_code == 2
    line = error_line(result)
    assert line.startswith(f"error: driver {V2}: incomplete user space, refusing to activate it: ")
    assert f"lib64/libnvidia-ml.so.{V2} is missing" in line
    assert f"the ld cache does not resolve libnvidia-ml.so.1 into /opt/nvidia/{V2}/lib64" in line
    assert "libcuda.so.1" not in line  # what is there is not reported
    assert os.readlink(root / "opt/nvidia/current") == V1
    assert tree(root) == before


def test_activate_refuses_a_library_the_ld_cache_cannot_use(tmp_path: Path) -> None:
    """The file is there, but it is no shared object: only the staged ld cache can tell."""
    root = _node_with_two_versions(tmp_path, broken="garbage")
    assert invoke("activate", V1, "--root", str(root)).exit_code == 0
    before = tree(root)
    result = invoke("activate", V2, "--root", str(root))
    assert result.exit_code == 2
    line = error_line(result)
    assert "is missing" not in line
    assert line.endswith(f"the ld cache does not resolve libnvidia-ml.so.1 into /opt/nvidia/{V2}/lib64")
    assert os.readlink(root / "opt/nvidia/current") == V1 and tree(root) == before


def test_install_refuses_an_incomplete_user_space(tmp_path: Path) -> None:
    """`install --activate` proves completeness before its rename: with V1 active, a V2 user space
    without libnvidia-ml is refused (exit 2), nothing of V2 stays, V1 stays active."""
    root = tmp_path / "root"
    root.mkdir()
    install_driver(root, tmp_path / "w1", V1)
    assert invoke("activate", V1, "--root", str(root)).exit_code == 0
    store = tmp_path / "store"
    store.mkdir()
    us = userspace_artifact(tmp_path / "work", V2, store, drop=("libnvidia-ml.so.*",))
    kmod, kmod_manifest = standin_kmod(tmp_path / "ko", V2, store)
    ra.store_with(store, [(us, artifact.read_manifest(us)), (kmod, kmod_manifest)])
    before = tree(root)
    args = ("--store", str(store), "--driver", V2, "--kernel", KERNEL, "--root", str(root), "--activate")
    result = invoke("install", *args)
    assert result.exit_code == 2
    line = error_line(result)
    assert line.startswith(f"error: driver {V2}: incomplete user space, refusing to install it: ")
    assert f"lib64/libnvidia-ml.so.{V2} is missing" in line and "libnvidia-ml.so.1" in line
    assert os.readlink(root / "opt/nvidia/current") == V1 and tree(root) == before

    us = userspace_artifact(tmp_path / "work-ok", V2, store)  # the same with the library: installs
    ra.store_with(store, [(us, artifact.read_manifest(us)), (kmod, kmod_manifest)])
    result = invoke("install", *args)
    assert result.exit_code == 0, result.output
    assert os.readlink(root / "opt/nvidia/current") == V2
