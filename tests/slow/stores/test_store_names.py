"""Issue 25 against the real stores: Debian's nginx serving an http store and the session's real
registry (docker-registry, TLS, htpasswd) holding a store pushed with `nodeprep artifacts push`.
A store index whose user-space entry is named `/…/victim` (with the sha256 and size of the valid
user space the store also serves under that name) made `install` download it over the victim, as
root even with --root, and the cache clean-up removed it. Now: one `error:` line naming the index
field, exit 2, the victim and everything outside the root as they were, nothing under the root.

The artifacts are stand-ins packed by nodeprep (tests/support/standin.py): the refusal happens at
the index, before any module is read, so no real driver build is needed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from nodeprep import artifact
from nodeprep.stores import oci
from nodeprep.stores.registry import sha256_digest
from tests.slow.node.helpers import cli
from tests.support.nginx import start_nginx
from tests.support.registry import Registry, write_auth_file
from tests.support.standin import KERNEL, standin_store, tree

pytestmark = pytest.mark.slow

V = "535.309.01"
REPO_NAME = "gpu/store-names"  # not the repository the other store tests share


def hostile_index(store: Path, victim: Path) -> bytes:
    """The store's index.json with the user space renamed to the victim's absolute path."""
    data = json.loads((store / artifact.INDEX).read_text())
    us = next(e for e in data["artifacts"] if e["kind"] == "userspace")
    us["name"] = str(victim)
    return json.dumps(data).encode()


def setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(store, victim, root): a stand-in store, a victim file beside it, an empty node root."""
    store = standin_store(tmp_path / "work", tmp_path / "store", V)
    victim = tmp_path / "x" / "victim"
    victim.parent.mkdir()
    victim.write_text("precious\n")
    root = tmp_path / "root"
    root.mkdir()
    return store, victim, root


def outside_root(tmp_path: Path) -> dict[str, str]:
    return {k: v for k, v in tree(tmp_path).items() if not k.startswith(("root", "nginx"))}


def assert_refused(r, needle: str) -> None:  # type: ignore[no-untyped-def]
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_nginx_store_name_is_not_a_path(tmp_path: Path) -> None:
    store, victim, root = setup(tmp_path)
    us = store / f"nvidia-userspace-{V}-amd64.tar.zst"
    served = store / str(victim).lstrip("/")  # nginx answers `//tmp/…/victim` from here
    served.parent.mkdir(parents=True)
    shutil.copyfile(us, served)
    (store / artifact.INDEX).write_bytes(hostile_index(store, victim))
    before = outside_root(tmp_path)
    with start_nginx(tmp_path / "nginx", store) as web:
        r = cli("install", "--store", web.url + "/", "--driver", V, "--kernel", KERNEL, "--root", str(root))
        listed = cli("artifacts", "list", web.url + "/")
    assert_refused(r, f"/index.json: artifacts[1].name: '{victim}' is not the artifact's name")
    assert_refused(listed, "].name: ")
    assert victim.read_text() == "precious\n"
    assert outside_root(tmp_path) == before
    assert sorted(p.name for p in root.iterdir()) == []


def test_registry_store_name_is_not_a_path(oci_registry: Registry, tmp_path: Path) -> None:
    """The store pushed with `artifacts push`, then an index artifact whose index.json names the
    user space by the victim's path (its refs map that name to the real user space's manifest)."""
    store, victim, root = setup(tmp_path)
    auth = write_auth_file(tmp_path / "config.json", oci_registry.host)
    location = oci_registry.url(REPO_NAME)
    creds = ("--registry-auth", str(auth), "--ca-file", str(oci_registry.ca))
    pushed = cli("artifacts", "push", str(store), location, *creds, "--json")
    assert pushed.returncode == 0, pushed.stderr

    options = oci.Options(registry_auth=str(auth), ca_file=str(oci_registry.ca))
    reg = oci.connect(location, options, push=True)
    _, refs = oci.read_remote_index(reg)
    us_name = f"nvidia-userspace-{V}-amd64.tar.zst"
    index = hostile_index(store, victim)
    refs_raw = artifact.canonical_json({**refs, str(victim): refs[us_name]})
    for blob in (index, refs_raw):
        reg.push_blob(sha256_digest(blob), len(blob), data=blob)
    reg.push_manifest(oci.INDEX_TAG, oci.index_manifest(index, refs_raw))
    before = outside_root(tmp_path)

    r = cli("install", "--store", location, "--driver", V, "--kernel", KERNEL, "--root", str(root), *creds)
    assert_refused(r, f"(index.json): artifacts[1].name: '{victim}' is not the artifact's name")
    listed = cli("artifacts", "list", location, *creds)
    assert_refused(listed, "].name: ")
    assert victim.read_text() == "precious\n"
    assert outside_root(tmp_path) == before
    assert sorted(p.name for p in root.iterdir()) == []
