"""Publishing whole builds to the session's real registry (see conftest.py): `build-matrix --build
--store oci://...` over the shared real build's cell (a cache hit: nothing compiles) plus a cell
that fails on its own; the one push after the matrix holds exactly the bytes of the directory store
the same build writes, and nothing of the failed cell."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nodeprep import artifact
from nodeprep.stores.ref import tag_for
from tests.slow.node.helpers import cli

from .conftest import Published
from .test_oci_registry import registry_get

pytestmark = pytest.mark.slow


def registry_args(p: Published) -> list[str]:
    return ["--registry-auth", str(p.auth), "--ca-file", str(p.registry.ca)]


def test_build_matrix_publishes_the_matrix_to_the_registry(real_build, published: Published,  # type: ignore[no-untyped-def]
                                                           tmp_path: Path) -> None:
    p = published
    repo = "gpu/matrix-drivers"
    location = p.registry.url(repo)
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(
        f"os: {real_build.os_name}\ndrivers: [{real_build.driver_version}]\n"
        f"kernels: [{real_build.kernel_release}, 6.1.0-999-amd64]\nflavours: [{real_build.flavour}]\n"
    )
    r = cli("build-matrix", str(matrix), "--build", "--store", location, "--cache", str(real_build.cache),
            "--no-smoke-test", *registry_args(p), "--json")
    assert r.returncode == 1, r.stderr[-3000:]  # the unknown kernel's cell failed, the other published
    out = json.loads(r.stdout)
    assert out["failed"] == 1 and out["pushed_index"].startswith("sha256:")
    ok = next(c for c in out["results"] if c["ok"])
    assert ok["compiled"] is False  # the shared build's cache: nothing compiled
    assert "s3cret" not in r.stderr + r.stdout

    listed = cli("artifacts", "list", f"{location}@{out['pushed_index']}", *registry_args(p), "--json")
    assert listed.returncode == 0, listed.stderr
    in_registry = {e["name"]: e["sha256"] for e in json.loads(listed.stdout)}
    local = {e.name: e.sha256 for e in artifact.LocalStore(real_build.store).entries()
             if e.name in (p.kmod.name, p.userspace.name)}
    assert in_registry == local  # exactly the ok cell's kmod and user space, byte for byte
    tags = json.loads(registry_get(p, "tags/list", repo=repo))["tags"]
    assert set(tags) == {"index", tag_for(p.kmod.name), tag_for(p.userspace.name)}
