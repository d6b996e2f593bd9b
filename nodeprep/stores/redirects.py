"""Which store redirects nodeprep follows, and what it sends there (pure functions).

Registries that serve fleets answer a blob GET with a redirect to object storage, a CDN or a plain
file server; an http(s) store (nodeprep/download.py) and a registry's token realm
(stores/registry.py) may redirect too, and all follow these rules. A registry's bytes are verified
by digest whatever serves them and an http store vouches for where it sends us, so the target needs
no trust of its own, but the request must not leak or weaken anything:
- credentials (the Authorization header) go only to the registry's own origin (scheme, host, port),
  or the realm's for a token request; a request with a body (an upload, a refresh-token POST) is
  never sent on;
- a plain-http target is followed only on loopback, or when the store was given with
  --insecure-http (the flag that allows plain http to a store off loopback; urls.plain_http_allowed);
- only http(s) targets without userinfo or characters URL parsers read differently, and at most
  MAX_REDIRECTS hops;
- the other headers (Range for a resume, Accept) go to the target unchanged.
"""

from __future__ import annotations

from urllib.parse import urljoin, urlsplit

from ..errors import InputError
from ..urls import ambiguous, plain_http_allowed

MAX_REDIRECTS = 5
STATUSES = frozenset({301, 302, 303, 307, 308})
FOLLOWED_METHODS = frozenset({"GET"})  # a HEAD's redirect answers it; an upload is never sent on


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of `url`, the port defaulted by the scheme."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or (443 if scheme == "https" else 80)


def shown(url: str) -> str:
    """`url` for a message: no userinfo, no query (a signed URL's query is a credential)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def next_hop(store: str, current: str, location: str | None, *, insecure_http: bool,
             server: str = "registry") -> str:
    """The absolute URL a redirect from `current` to `location` leads to, or an InputError naming
    `store` (and the `server` kind in its wording) when nodeprep must not follow it (see the module
    docstring). Decided from the URLs alone, before anything connects to the target."""
    if not location:
        raise InputError(f"{store}: the {server} answered a redirect without a Location")
    target = urljoin(current, location.strip())
    parts = urlsplit(target)
    try:
        host, _port = parts.hostname, parts.port
    except ValueError:
        host = None
    if parts.scheme not in ("http", "https") or not host or ambiguous(target) or "@" in parts.netloc:
        raise InputError(f"{store}: the {server} redirected to {shown(target)!r}, which is not an "
                         f"http(s) URL with a plain host; refused")
    if parts.scheme == "http" and not plain_http_allowed(host, insecure_http=insecure_http):
        raise InputError(f"{store}: the {server} redirected to plain http ({shown(target)}), off "
                         f"loopback; refused (--insecure-http allows it)")
    return target


def hop_headers(headers: dict[str, str], registry_url: str, target: str) -> dict[str, str]:
    """The headers for a request to `target`: all of `headers`, less Authorization unless `target`
    has the registry's origin."""
    if origin(target) == origin(registry_url):
        return headers
    return {k: v for k, v in headers.items() if k.lower() != "authorization"}
