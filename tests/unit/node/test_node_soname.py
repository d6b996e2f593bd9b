"""Issue 25 item 2: a library's SONAME must not put a link outside its directory.

A user-space artifact with a library built by gcc with `-Wl,-soname,../../…/x/victim-link` used to
install with exit 0: `ldconfig -n` over the staged lib64 replaced `victim-link` outside the root,
and `artifacts verify` passed it. Now install refuses it (exit 2, one `error:` line naming the
artifact and the library) before anything is linked, nothing stays under the root, the victim is
untouched, and `artifacts verify` names the same problem; `activate` refuses a root that already
holds such a library (installed by an older nodeprep). The links nodeprep makes itself are the
links `ldconfig -n` makes, for crafted directories and for a real NVIDIA user space.

Inputs are real: shared objects compiled here by gcc, packed with nodeprep.artifact.pack into a
real directory store, installed through the real CLI.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from nodeprep import artifact, runner
from nodeprep.node import integration
from tests.support import rawartifact as ra
from tests.support.clirunner import error_line, invoke
from tests.support.elfsynth import compile_so
from tests.support.standin import standin_kmod, tree
from tests.unit.join.conftest import build_payload, install_driver, unpack_unactivated

V1, V2 = "535.216.03", "535.309.01"
KERNEL = "6.1.0-28-amd64"


def escaping_soname(victim: Path) -> str:
    """A SONAME that, as a link beside any library on this machine, lands on `victim`."""
    return "../" * 40 + str(victim).lstrip("/")


def _store_of(tmp_path: Path, payload: Path) -> tuple[Path, Path]:
    """(tmp_path/store, its user-space artifact): `payload` packed as V2's user space beside a
    stand-in kmod of V2."""
    store = tmp_path / "store"
    store.mkdir()
    manifest = artifact.Manifest(kind="userspace", driver_version=V2, arch="amd64", os="debian-12",
                                 input_digest="0" * 64, inputs={})
    us, _ = artifact.pack(payload, manifest, store)
    kmod, kmod_manifest = standin_kmod(tmp_path / "ko", V2, store)
    ra.store_with(store, [(us, artifact.read_manifest(us)), (kmod, kmod_manifest)])
    return store, us


def evil_store(tmp_path: Path, victim: Path) -> tuple[Path, Path]:
    """A directory store: V2's user space plus lib64/libevil.so.V2 with an escaping SONAME, and
    a stand-in kmod. Returns (store, user-space artifact)."""
    payload = build_payload(tmp_path / "work", V2)
    compile_so(payload / "lib64" / f"libevil.so.{V2}", escaping_soname(victim))
    return _store_of(tmp_path, payload)


def test_install_refuses_a_library_whose_soname_escapes(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    victim = tmp_path / "x" / "victim-link"
    victim.parent.mkdir()
    victim.symlink_to("original")  # ldconfig -n replaced a link there (and made one where none was)
    store, us = evil_store(tmp_path, victim)
    before = tree(tmp_path)

    result = invoke("install", "--store", str(store), "--driver", V2, "--kernel", KERNEL, "--root", str(root))
    assert result.exit_code == 2
    line = error_line(result)
    assert us.name in line
    assert f"lib64/libevil.so.{V2}: SONAME '{escaping_soname(victim)}' is not a plain file name" in line
    assert os.readlink(victim) == "original"
    after = tree(tmp_path)
    new = sorted(set(after) - set(before))
    assert all(p.startswith(("root/opt", "root/var")) and after[p] == "dir" for p in new), new
    assert {k: v for k, v in after.items() if k in before} == before
    assert list((root / "opt/nvidia").iterdir()) == []

    victim.unlink()  # and where nothing was, nothing is made
    assert invoke("install", "--store", str(store), "--driver", V2, "--kernel", KERNEL,
                  "--root", str(root)).exit_code == 2
    assert not victim.is_symlink() and not victim.exists()
    assert list((root / "opt/nvidia").iterdir()) == []

    verified = invoke("artifacts", "verify", str(store))  # the same rule as install
    assert verified.exit_code == 1
    assert (f"{us.name}: lib64/libevil.so.{V2}: SONAME '{escaping_soname(victim)}' is not a plain "
            "file name") in verified.output


@pytest.mark.parametrize("linked", [False, True])
def test_activate_refuses_a_root_holding_such_a_library(tmp_path: Path, linked: bool) -> None:
    """A root unpacked before the rule (an older nodeprep): `ldconfig` at activation would make the
    link, so activation is refused and V1 stays active. Also when the library sits outside lib64
    and a link in lib64 leads to it (ldconfig follows links)."""
    root = tmp_path / "root"
    root.mkdir()
    install_driver(root, tmp_path / "w1", V1)
    assert invoke("activate", V1, "--root", str(root)).exit_code == 0
    victim = tmp_path / "x" / "victim-link"
    victim.parent.mkdir()
    vdir = unpack_unactivated(root, build_payload(tmp_path / "w2", V2), tmp_path / "store", V2)
    where = f"bin/libevil.so.{V2}" if linked else f"lib64/libevil.so.{V2}"
    compile_so(vdir / where, escaping_soname(victim))
    if linked:
        (vdir / "lib64" / "libevil.so.1").symlink_to(f"../{where}")
    before = tree(tmp_path)

    result = invoke("activate", V2, "--root", str(root))
    assert result.exit_code == 2
    line = error_line(result)
    assert f"/opt/nvidia/{V2}/{where}: SONAME '{escaping_soname(victim)}'" in line
    assert os.readlink(root / "opt/nvidia/current") == V1
    assert tree(tmp_path) == before and not victim.is_symlink()


def _lib64_tree(top: Path) -> dict[str, str]:
    return {p.name: ("link:" + os.readlink(p)) if p.is_symlink() else "file" for p in top.iterdir()}


def test_links_are_the_links_ldconfig_n_makes(tmp_path: Path) -> None:
    """Several versions of one soname (the newest wins, by glibc's version order), a library
    without SONAME, one whose SONAME is its own name, a correct link, a stale link, a wrong link, a
    regular file in the link's place, a file whose name is no library name."""
    d = tmp_path / "a"
    d.mkdir()
    for name, soname in [("libfoo.so.1.2.3", "libfoo.so.1"), ("libfoo.so.1.10.0", "libfoo.so.1"),
                         ("libfoo.so.1.9", "libfoo.so.1"), ("libnone.so.4", None),
                         ("libself.so.7", "libself.so.7"), ("libok.so.2.0", "libok.so.2"),
                         ("libstale.so.3.0", "libstale.so.3"), ("libwrong.so.5.0", "libwrong.so.5"),
                         ("libwrong.so.6.0", "libwrong.so.6"), ("libfile.so.8.0", "libfile.so.8"),
                         ("notalib", "libnot.so.9"), ("ld-test.so.2.1", "ld-test.so.2")]:
        compile_so(d / name, soname)
    (d / "libok.so.2").symlink_to("libok.so.2.0")
    (d / "libstale.so.3").symlink_to("libstale.so.3.gone")
    (d / "libwrong.so.5").symlink_to("libwrong.so.6.0")
    (d / "libfile.so.8").write_bytes(b"a regular file\n")
    expected = tmp_path / "b"
    shutil.copytree(d, expected, symlinks=True)
    runner.run(["ldconfig", "-n", expected], timeout=60)

    made = integration.soname_links(d)
    assert _lib64_tree(d) == _lib64_tree(expected)
    assert made == ["ld-test.so.2", "libfoo.so.1", "libstale.so.3", "libwrong.so.5", "libwrong.so.6"]
    assert os.readlink(d / "libfoo.so.1") == "libfoo.so.1.10.0"
    assert integration.soname_links(d) == []  # a second run changes nothing, as ldconfig -n


def test_links_made_at_install_are_ldconfig_n_links(tmp_path: Path) -> None:
    """Through the real CLI: the installed lib64 equals the artifact's lib64 after `ldconfig -n`."""
    root = tmp_path / "root"
    root.mkdir()
    store, us = _store_of(tmp_path, build_payload(tmp_path / "work", V2))
    expected = tmp_path / "expected"
    expected.mkdir()
    artifact.extract(us, expected)
    runner.run(["ldconfig", "-n", expected / "lib64"], timeout=60)

    result = invoke("install", "--store", str(store), "--driver", V2, "--kernel", KERNEL, "--root", str(root))
    assert result.exit_code == 0, result.output
    installed = _lib64_tree(root / "opt/nvidia" / V2 / "lib64")
    assert installed == _lib64_tree(expected / "lib64")
    assert installed["libnvidia-ml.so.1"] == f"link:libnvidia-ml.so.{V2}"  # not in the artifact


@pytest.mark.slow
def test_links_for_the_real_user_space_are_ldconfig_n_links(test_cache: Path, tmp_path: Path) -> None:
    """The real 535 user space the slow tier builds (tests/support/realbuild.py), soname links
    removed: nodeprep makes exactly the links `ldconfig -n` makes."""
    found = sorted((test_cache / "userspace").glob("nvidia-userspace-*-amd64.tar.zst"))
    if not found:
        pytest.skip(f"no real user-space artifact in {test_cache}/userspace")
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    artifact.extract(found[-1], ours)
    for p in (ours / "lib64").iterdir():
        if p.is_symlink():
            p.unlink()
    shutil.copytree(ours / "lib64", theirs, symlinks=True)
    runner.run(["ldconfig", "-n", theirs], timeout=120)
    assert integration.soname_links(ours / "lib64")
    assert _lib64_tree(ours / "lib64") == _lib64_tree(theirs)


def test_a_lib64_that_is_a_symlink_gets_no_links_and_is_refused(tmp_path: Path) -> None:
    """No link is made through a symlinked lib64 (nothing is followed); the root is incomplete."""
    root = tmp_path / "root"
    root.mkdir()
    payload = build_payload(tmp_path / "work", V2)
    (payload / "lib64").rename(payload / "libdir")
    (payload / "lib64").symlink_to("libdir")
    store, _ = _store_of(tmp_path, payload)

    result = invoke("install", "--store", str(store), "--driver", V2, "--kernel", KERNEL, "--root", str(root))
    assert result.exit_code == 2
    assert "incomplete user space" in error_line(result)
    assert list((root / "opt/nvidia").iterdir()) == []
