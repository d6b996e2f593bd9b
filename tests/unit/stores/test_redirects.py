"""The registry redirect rules (nodeprep/stores/redirects.py), pure: which targets are followed and
which headers go there. The same rules against a real registry and nginx:
tests/slow/stores/test_oci_redirect.py."""

from __future__ import annotations

import pytest

from nodeprep.errors import InputError
from nodeprep.stores import redirects

STORE = "oci://registry.example/gpu/drivers"
BLOB = "https://registry.example/v2/gpu/drivers/blobs/sha256:" + "ab" * 32


@pytest.mark.parametrize(("location", "insecure", "target"), [
    ("https://cdn.example/blobs/x?sig=1", False, "https://cdn.example/blobs/x?sig=1"),
    ("/v2/other/blobs/y", False, "https://registry.example/v2/other/blobs/y"),
    ("http://127.0.0.1:8080/data", False, "http://127.0.0.1:8080/data"),
    ("http://[::1]/data", False, "http://[::1]/data"),
    ("http://localhost/data", False, "http://localhost/data"),
    ("http://files.example/data", True, "http://files.example/data"),
])
def test_followed(location: str, insecure: bool, target: str) -> None:
    assert redirects.next_hop(STORE, BLOB, location, insecure_http=insecure) == target


@pytest.mark.parametrize(("location", "needle"), [
    ("http://192.0.2.1/data?X-Signature=secret", "redirected to plain http (http://192.0.2.1/data), off "
                                                 "loopback; refused (--insecure-http allows it)"),
    ("http://files.example:8080/d", "plain http (http://files.example:8080/d)"),
    ("file:///etc/shadow", "not an http(s) URL"),
    ("ftp://files.example/d", "not an http(s) URL"),
    ("https://:443/x", "not an http(s) URL"),
    (None, "redirect without a Location"),
    ("", "redirect without a Location"),
])
def test_refused_with_one_line_naming_the_store(location: str | None, needle: str) -> None:
    with pytest.raises(InputError) as e:
        redirects.next_hop(STORE, BLOB, location, insecure_http=False)
    msg = str(e.value)
    assert msg.startswith(STORE + ": ") and needle in msg and "\n" not in msg
    assert "secret" not in msg


def test_credentials_only_to_the_registry_origin() -> None:
    headers = {"Authorization": "Basic c2VjcmV0", "Range": "bytes=10-", "Accept": "*/*"}
    base = "https://registry.example/v2/"
    assert redirects.hop_headers(headers, base, "https://registry.example:443/v2/x") == headers
    for target in ("https://cdn.example/x", "https://registry.example:8443/x",
                   "http://registry.example/x", "https://REGISTRY.example.evil/x"):
        assert redirects.hop_headers(headers, base, target) == {"Range": "bytes=10-", "Accept": "*/*"}
    lower = {"authorization": "Bearer t", "Range": "bytes=0-"}
    assert redirects.hop_headers(lower, base, "https://cdn.example/x") == {"Range": "bytes=0-"}


def test_shown_drops_userinfo_and_query() -> None:
    assert redirects.shown("https://u:p@cdn.example:8443/a/b?sig=s#f") == "https://cdn.example:8443/a/b"
    assert redirects.shown("http://[::1]:80/d") == "http://[::1]:80/d"
