"""A store's names are data, never paths (issue 25): an index entry whose name is absolute or climbs
with `..` is refused (one `error:` line, exit 2, nothing written) by install over http, from a
directory store, by `artifacts verify|list`; index fields of the wrong type are refused the same
way; a directory store's index and artifacts are not read through symbolic links. And `artifacts
list https://…` honours --ca-file like install (issue 29).

Stores are real: stand-in artifacts packed by nodeprep (tests/support/standin.py), served by a
loopback http(s) server this test starts (tests/support/httpdir.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from nodeprep import artifact
from tests.support.clirunner import error_line, invoke
from tests.support.httpdir import serve_directory
from tests.support.registry import make_ca
from tests.support.standin import KERNEL, standin_store, tree

V = "535.309.01"


@pytest.fixture(scope="module")
def good_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("standin")
    return standin_store(work / "work", work / "store", V)


def copy_store(good: Path, dest: Path) -> Path:
    shutil.copytree(good, dest, symlinks=True)
    return dest


def raw_entries(store: Path) -> list[dict[str, Any]]:
    return list(json.loads((store / artifact.INDEX).read_text())["artifacts"])


def write_index(store: Path, entries: list[dict[str, Any]]) -> None:
    (store / artifact.INDEX).write_text(json.dumps({"format": 1, "artifacts": entries}))


def userspace_of(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return next(e for e in entries if e["kind"] == "userspace")


def outside(tmp_path: Path, rel: Path) -> set[str]:
    """Everything under tmp_path outside `rel` (the node's root): path -> content."""
    return {f"{k}={v}" for k, v in tree(tmp_path).items() if not k.startswith(str(rel))}


def install(store: str, root: Path):  # type: ignore[no-untyped-def]
    return invoke("install", "--store", store, "--driver", V, "--kernel", KERNEL, "--root", str(root))


@pytest.mark.parametrize("how", ["absolute", "dotdot"])
def test_http_store_name_never_writes_outside_the_cache(how: str, good_store: Path, tmp_path: Path) -> None:
    """The issue's reproduction: an http store whose user-space entry is named `/…/victim` (with
    the sha256 and size of a valid user space, served at that URL too) or `../../…` (a garbage
    blob): install wrote the download to that path and the cache clean-up deleted it."""
    store = copy_store(good_store, tmp_path / "s")
    root = tmp_path / "root"
    root.mkdir()
    entries = raw_entries(store)
    us = userspace_of(entries)
    victim = tmp_path / "x" / "victim"
    victim.parent.mkdir()
    victim.write_text("precious\n")
    if how == "absolute":
        us["name"] = str(victim)
        served = store / str(victim).lstrip("/")
        served.parent.mkdir(parents=True)
        shutil.copyfile(store / f"nvidia-userspace-{V}-amd64.tar.zst", served)
    else:  # root/var/cache/nodeprep/../../../../x/planted is tmp_path/x/planted
        garbage = b"attacker's bytes\n"
        us.update(name="../../../../x/planted", sha256=artifact.sha256_bytes(garbage), size=len(garbage))
        (store / "x").mkdir()
        (store / "x" / "planted").write_bytes(garbage)
    write_index(store, entries)
    before = outside(tmp_path, Path("root"))

    with serve_directory(store) as url:
        r = install(url + "/", root)
    assert r.exit_code == 2
    line = error_line(r)
    assert "index.json: artifacts[" in line and "].name: " in line and "never paths" in line
    assert victim.read_text() == "precious\n"
    assert not (tmp_path / "x" / "planted").exists()
    assert outside(tmp_path, Path("root")) == before
    assert not (root / "opt").exists() and not (root / "var/cache/nodeprep").exists()


def test_directory_store_refuses_links_and_paths(good_store: Path, tmp_path: Path) -> None:
    """A directory store's index.json and artifacts are regular files, not links (to wherever), and
    its names are file names: install and verify refuse instead of reading elsewhere."""
    root = tmp_path / "root"
    root.mkdir()
    us_name = f"nvidia-userspace-{V}-amd64.tar.zst"

    linked_index = copy_store(good_store, tmp_path / "linked-index")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (linked_index / artifact.INDEX).rename(elsewhere / artifact.INDEX)
    (linked_index / artifact.INDEX).symlink_to(elsewhere / artifact.INDEX)
    for args in (("install", "--store", str(linked_index), "--driver", V, "--kernel", KERNEL, "--root",
                  str(root)), ("artifacts", "verify", str(linked_index)),
                 ("artifacts", "list", str(linked_index))):
        r = invoke(*args)
        assert r.exit_code == 2 and "index.json: is a symbolic link" in error_line(r), args

    linked_us = copy_store(good_store, tmp_path / "linked-us")
    (linked_us / us_name).rename(elsewhere / us_name)
    (linked_us / us_name).symlink_to(elsewhere / us_name)
    r = install(str(linked_us), root)
    assert r.exit_code == 2 and f"{us_name}: is a symbolic link" in error_line(r)
    r = invoke("artifacts", "verify", str(linked_us))
    assert r.exit_code == 1 and f"{us_name}: {linked_us / us_name}: is a symbolic link" in r.output

    absolute = copy_store(good_store, tmp_path / "absolute")
    entries = raw_entries(absolute)
    userspace_of(entries)["name"] = str(elsewhere / us_name)  # a valid artifact, outside the store
    write_index(absolute, entries)
    for args in (("install", "--store", str(absolute), "--driver", V, "--kernel", KERNEL, "--root",
                  str(root)), ("artifacts", "verify", str(absolute)), ("artifacts", "list", str(absolute))):
        r = invoke(*args)
        assert r.exit_code == 2 and "].name: " in error_line(r), args
    assert not (root / "opt").exists()


@pytest.mark.parametrize(("field", "value", "why"), [
    ("sha256", 5, "is not a string"),
    ("size", "12", "is not a size in bytes"),
    ("size", -1, "is not a size in bytes"),
    ("name", None, "is required"),
    ("kernel_release", "6.1/../x", "is not a kernel release"),
    ("driver_version", ["535"], "is not a string"),
])
def test_index_field_types(field: str, value: Any, why: str, good_store: Path, tmp_path: Path) -> None:
    """Issue 25 item 6: `sha256: 5` made install and verify traceback (exit 1)."""
    store = copy_store(good_store, tmp_path / "s")
    entries = raw_entries(store)
    kmod = next(e for e in entries if e["kind"] == "kmod")
    kmod[field] = value
    i = entries.index(kmod)
    write_index(store, entries)
    root = tmp_path / "root"
    root.mkdir()
    for args in (("install", "--store", str(store), "--driver", V, "--kernel", KERNEL, "--root", str(root)),
                 ("artifacts", "verify", str(store)), ("artifacts", "list", str(store))):
        r = invoke(*args)
        assert r.exit_code == 2, (args, r.output)
        assert f"index.json: artifacts[{i}].{field}: {value!r} {why}" in error_line(r)
    assert not (root / "opt").exists()


def test_artifacts_list_https_honours_ca_file(good_store: Path, tmp_path: Path) -> None:
    """Issue 29: `artifacts list https://…` ignored --ca-file (install honoured it)."""
    ca, crt, key = make_ca(tmp_path / "tls")
    with serve_directory(good_store, tls=(crt, key)) as url:
        assert url.startswith("https://")
        r = invoke("artifacts", "list", url + "/", "--ca-file", str(ca), "--json")
        assert r.exit_code == 0, r.output
        listed = sorted(e["name"] for e in json.loads(r.stdout))
        assert listed == sorted(e["name"] for e in raw_entries(good_store))
        r = invoke("artifacts", "list", url + "/")  # the system's CAs do not know the test CA
        assert r.exit_code != 0 and "TLS" in error_line(r)


def test_ansible_modules_refuse_a_path_name(good_store: Path, tmp_path: Path) -> None:
    """The front-ends read stores through the same reader: the nodeprep_driver module (check mode and
    run) over http and nodeprep_build's check mode on a directory store fail the task, exit code 2,
    with the index field named, and nothing is written."""
    from tests.unit.fleet.test_module_sequence import module

    store = copy_store(good_store, tmp_path / "s")
    entries = raw_entries(store)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    userspace_of(entries)["name"] = str(victim)
    write_index(store, entries)
    root = tmp_path / "root"
    root.mkdir()
    with serve_directory(store) as url:
        args = {"root": str(root), "version": V, "store": url + "/", "kernel": KERNEL}
        for check in (True, False):
            status, result = module("nodeprep_driver", args, check=check)
            assert status == "FAILED!" and result["exit_code"] == 2, result
            assert "].name: " in str(result["msg"]) and "never paths" in str(result["msg"])
    build = {"driver": V, "kernel": KERNEL, "store": str(store), "cache": str(tmp_path / "cache")}
    status, result = module("nodeprep_build", build, check=True)
    assert status == "FAILED!" and result["exit_code"] == 2 and "].name: " in str(result["msg"]), result
    assert victim.read_text() == "precious\n"
    assert not (root / "opt").exists() and not (root / "var/cache/nodeprep").exists()


def test_kernel_hook_refuses_a_path_name(tmp_path: Path) -> None:
    """The kernel hook installs through the same reader: an http store whose kmod entry for the new
    kernel is named by a victim's path (the bytes served there, with their sha256 and size) is one
    loud line, and the victim keeps its bytes."""
    from nodeprep.node import kernelhook
    from tests.unit.node.test_kernel_hook import K_NEW, node_root

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    store = tmp_path / "store"
    bytes_ = b"attacker's kmod\n"
    (store / str(victim).lstrip("/")).parent.mkdir(parents=True)
    (store / str(victim).lstrip("/")).write_bytes(bytes_)
    common = {"driver_version": V, "arch": "amd64", "os": "debian-12", "size": len(bytes_),
              "sha256": artifact.sha256_bytes(bytes_), "input_digest": "0" * 64}
    write_index(store, [
        {**common, "name": str(victim), "kind": "kmod", "flavour": "proprietary", "kernel_release": K_NEW,
         "vermagic": f"{K_NEW} SMP"},
        {**common, "name": f"nvidia-userspace-{V}-amd64.tar.zst", "kind": "userspace"}])
    with serve_directory(store) as url:
        root = node_root(tmp_path, store=url + "/", keep=False)
        before = tree(root)
        r = invoke("kernel-hook", "postinst", K_NEW, "--root", str(root))
    assert victim.read_text() == "precious\n"
    assert r.exit_code == 1
    [line] = r.output.splitlines()
    assert line.startswith(f"{kernelhook.LOUD} {K_NEW}: ") and "artifacts[0].name: " in line, line
    assert tree(root) == before


def test_links_planted_in_the_download_cache_are_not_followed(good_store: Path, tmp_path: Path) -> None:
    """A root (an image) may hold links where install keeps its downloads: `<name>.part` and `<name>`
    pointing at a victim. The download neither writes through nor reuses them; install succeeds."""
    root = tmp_path / "root"
    cache = root / "var/cache/nodeprep"
    cache.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    for e in raw_entries(good_store):
        (cache / (e["name"] + ".part")).symlink_to(victim)
        (cache / e["name"]).symlink_to(victim)
    with serve_directory(good_store) as url:
        r = install(url + "/", root)
    assert r.exit_code == 0, r.output
    assert victim.read_text() == "precious\n"
    assert (root / "opt/nvidia" / V / "manifest.json").is_file()
