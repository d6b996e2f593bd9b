"""Blobs behind registry redirects, for real: Debian's docker-registry (CNCF distribution 2.8, TLS
from a test CA, htpasswd) with the storage middleware `redirect`, whose blob GETs answer 307 to
Debian's nginx serving the registry's storage directory on loopback (tests/support/nginx.py logs
each request, and whether an Authorization header came). The session's real build is pushed there
and installed with `nodeprep install --store oci://...`. The refusals use the loopback fault proxy
in front of the ordinary test registry, answering a blob GET with a 307 of its own."""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from nodeprep.errors import InputError
from nodeprep.stores import oci
from nodeprep.stores.store import Store
from tests.slow.node.helpers import cli
from tests.support.faultproxy import FaultProxy, Faults
from tests.support.registry import write_auth_file

from .conftest import REPO_NAME, Published, Redirected
from .test_oci_registry import assert_refused, fresh_root, install, install_with_corrupted_kmod, snapshot

pytestmark = pytest.mark.slow

TEST_NET = "http://192.0.2.1"  # TEST-NET-1: documentation only, never routed; and never contacted
_connects: list[Any] | None = None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "socket.connect" and _connects is not None:
        _connects.append(args[1])


sys.addaudithook(_audit)  # records the address of every socket connect while _connects is a list


def blob_uri(digest: str) -> str:
    """The path nginx sees for a blob: the redirect's base URL + the filesystem driver's path."""
    return f"/docker/registry/v2/blobs/sha256/{digest[:2]}/{digest}/data"


def test_install_fetches_the_blobs_from_nginx_without_credentials(  # type: ignore[no-untyped-def]
        real_build, redirected: Redirected, tmp_path: Path) -> None:
    p, web = redirected.published, redirected.nginx
    root = fresh_root(tmp_path)
    r = install(p, root)
    assert r.returncode == 0, r.stderr
    vdir = root / "opt/nvidia" / p.version
    assert (vdir / "manifest.json").is_file() and (vdir / "modules" / p.kernel / "nvidia.ko").is_file()
    hits = web.hits()
    for entry in (p.kmod, p.userspace):
        served = [h for h in hits if h.uri == blob_uri(entry.sha256) and h.method == "GET"]
        assert [(h.status, h.size) for h in served] == [(200, entry.size)], hits
    assert not [h for h in hits if h.auth]  # the credentials stayed with the registry
    # the log does show an Authorization header when one comes (the check above can fail)
    req = urllib.request.Request(web.url + blob_uri(p.kmod.sha256), method="HEAD",
                                 headers={"Authorization": "Basic bm90LXNlbnQ="})
    urllib.request.urlopen(req, timeout=10).close()
    assert web.hits()[-1].auth

    # publishing again: the registry answers each blob HEAD with its redirect, which says "present"
    # (a HEAD's redirect is not followed), so nothing is uploaded; nginx sees only the GETs of the
    # small index and refs blobs the publisher reads back
    served = len(web.hits())
    r = cli("artifacts", "push", str(real_build.store), p.location, "--registry-auth", str(p.auth),
            "--ca-file", str(p.registry.ca), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["index"] == p.index_digest
    new = web.hits()[served:]
    assert all(h.method == "GET" and h.size < 1 << 20 and not h.auth for h in new), new


def test_resume_across_the_redirect(redirected: Redirected, tmp_path: Path) -> None:
    """A partial kmod download from an earlier run: the Range header goes on to nginx, which sends
    only the rest."""
    p, web = redirected.published, redirected.nginx
    root = fresh_root(tmp_path)
    cache = root / "var/cache/nodeprep"
    cache.mkdir(parents=True)
    kept = 5 << 20
    with open(p.registry.blob_data("sha256:" + p.kmod.sha256), "rb") as f:
        (cache / (p.kmod.name + ".part")).write_bytes(f.read(kept))
    r = install(p, root)
    assert r.returncode == 0, r.stderr
    served = [h for h in web.hits() if h.uri == blob_uri(p.kmod.sha256) and h.method == "GET"]
    assert (served[-1].status, served[-1].size, served[-1].range) == (206, p.kmod.size - kept,
                                                                      f"bytes={kept}-")
    assert not served[-1].auth


def test_corrupted_blob_behind_the_redirect_is_refused(redirected: Redirected, tmp_path: Path) -> None:
    p, web = redirected.published, redirected.nginx
    install_with_corrupted_kmod(p, tmp_path)
    assert web.hits()[-1].uri == blob_uri(p.kmod.sha256)  # nginx served the corrupt bytes


def _proxy_store(p: Published, proxy: FaultProxy, tmp_path: Path) -> tuple[str, Path]:
    auth = write_auth_file(tmp_path / "proxy.json", f"127.0.0.1:{proxy.port}")
    return f"oci+http://127.0.0.1:{proxy.port}/{REPO_NAME}", auth


def test_plain_http_redirect_off_loopback_is_refused_before_connecting(published: Published,
                                                                        tmp_path: Path) -> None:
    """The proxy (loopback, plain http, no --insecure-http) answers the kmod blob GET with a 307 to
    a TEST-NET address: one line naming the store, the root as it was, and no connection there."""
    global _connects
    p = published
    blob = f"/blobs/sha256:{p.kmod.sha256}"
    root = fresh_root(tmp_path)
    before = snapshot(root)
    with FaultProxy(upstream=f"https://{p.registry.host}", cafile=p.registry.ca) as proxy:
        proxy.reset(Faults(match=blob, redirect=TEST_NET))
        store, auth = _proxy_store(p, proxy, tmp_path)
        r = install(p, root, store=store, auth=auth, ca=False)
        assert_refused(r, 2, f"{store}: the registry redirected to plain http ({TEST_NET}/v2/")
        assert "off loopback; refused (--insecure-http allows it)" in r.stderr
        assert snapshot(root) == before
        assert [s.status for s in proxy.seen if blob in s.path] == [307]

        # the same in this process, where every socket connect is seen
        node = Store(store, oci.Options(registry_auth=str(auth)))
        entry = next(e for e in node.entries() if e.name == p.kmod.name)
        _connects = []
        try:
            with pytest.raises(InputError, match="redirected to plain http"):
                node.fetch(entry, tmp_path / "cache")
            seen = list(_connects)
        finally:
            _connects = None
    assert seen and all(addr[0] == "127.0.0.1" for addr in seen), seen


def test_redirect_loop_is_bounded(published: Published, tmp_path: Path) -> None:
    p = published
    blob = f"/blobs/sha256:{p.kmod.sha256}"
    root = fresh_root(tmp_path)
    before = snapshot(root)
    with FaultProxy(upstream=f"https://{p.registry.host}", cafile=p.registry.ca) as proxy:
        proxy.reset(Faults(match=blob, redirect=proxy.url))  # to itself, again and again
        store, auth = _proxy_store(p, proxy, tmp_path)
        r = install(p, root, store=store, auth=auth, ca=False)
        assert_refused(r, 2, "more than 5 redirects")
        assert [s.status for s in proxy.seen if blob in s.path] == [307] * 6
    assert snapshot(root) == before
