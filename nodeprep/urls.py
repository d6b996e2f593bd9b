"""URLs that may carry credentials or reach a store: redact, and the one transport rule.

nodeprep refuses credentials inside a store URL (docs/profile.md: they belong in a credentials file,
like the bootstrap token); `redact_url` is applied wherever a URL is logged or put into an error, so
even a URL that reaches a message by another route never shows its userinfo.

The transport rule, for every store kind (http(s), oci) and every redirect hop: plain http only to
a loopback host, or when the user said `--insecure-http` (`plain_http_allowed`), decided from the
URL before any connection is made (docs/node.md, "Stores").
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import SplitResult, urlsplit

from .errors import InputError

REDACTED = "<redacted>"
# The authority ends at the first / ? # (or whitespace in running text); the userinfo at its LAST
# '@', as urlsplit splits it, so a password that contains '@' is redacted whole.
_USERINFO_RE = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#\s]*)@")
# Characters on which URL parsers disagree (urllib3 ends the authority at a backslash, urlsplit does
# not; urlsplit drops tabs and newlines): a URL that has one is refused, not guessed at.
_AMBIGUOUS_RE = re.compile(r"[\\\x00-\x20\x7f]")


def has_userinfo(url: str) -> bool:
    """True when `url` (surrounding whitespace ignored) has a `user[:password]@` part in its
    authority, however written."""
    return bool(_USERINFO_RE.match(url.strip()))


def redact_url(text: str) -> str:
    """`text` with the userinfo of every URL in it replaced by <redacted>."""
    return _USERINFO_RE.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)


def is_loopback(hostname: str) -> bool:
    """`localhost` or a loopback address (127.0.0.0/8, ::1); any other name is not loopback."""
    if hostname.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


def plain_http_allowed(hostname: str, *, insecure_http: bool) -> bool:
    """The transport rule: plain http only to loopback, or with --insecure-http."""
    return insecure_http or is_loopback(hostname)


def parse_store_location(location: str, *, insecure_http: bool, what: str = "--store") -> str:
    """A store location normalised once (surrounding whitespace stripped) and checked before
    anything connects: no credentials in a URL of any scheme, an http(s) URL with a host and a
    valid port and nothing parsers read differently, plain http only by `plain_http_allowed`.
    A directory path is returned stripped; `oci://` references are parsed by stores/ref.py."""
    loc = location.strip()
    if not loc:
        raise InputError(f"{what}: the store location is empty")
    if has_userinfo(loc):
        raise InputError(f"{what}: {redact_url(loc)}: credentials in the URL are refused",
                         hint="give them in a credentials file instead (docs/profile.md)")
    if urlsplit(loc).scheme.lower() in ("http", "https"):
        check_transport(loc, insecure_http=insecure_http, what=what)
    return loc


def check_transport(url: str, *, insecure_http: bool, what: str) -> None:
    """Refuses (InputError naming `what`) an http(s) URL that nodeprep must not connect to: one
    `check_http_url` refuses, or plain http that `plain_http_allowed` does not allow."""
    parts = check_http_url(url, what=what)
    if parts.scheme == "http" and not plain_http_allowed(parts.hostname or "", insecure_http=insecure_http):
        raise InputError(f"{what}: {redact_url(url)}: plain http to a store off loopback is refused "
                         f"(anyone on the path could swap the index and the artifacts); use https, "
                         f"or --insecure-http")


def ambiguous(url: str) -> bool:
    """True when `url` has a character on which URL parsers disagree (see _AMBIGUOUS_RE)."""
    return bool(_AMBIGUOUS_RE.search(url))


def check_http_url(url: str, *, what: str) -> SplitResult:
    """`url` split, or an InputError naming `what` when it is not a plain http(s) URL with a host:
    userinfo, a bad port or a character URL parsers read differently are refused."""
    shown = redact_url(url)
    if ambiguous(url):
        raise InputError(f"{what}: {shown!r} has a backslash, a space or a control character; refused")
    parts = urlsplit(url)
    try:
        host, _port = parts.hostname, parts.port
    except ValueError:
        raise InputError(f"{what}: {shown!r} has an invalid port; refused") from None
    if parts.scheme.lower() not in ("http", "https") or not host:
        raise InputError(f"{what}: {shown!r} is not an http(s) URL with a host; refused")
    if "@" in parts.netloc:
        raise InputError(f"{what}: {shown}: credentials in the URL are refused",
                         hint="give them in a credentials file instead (docs/profile.md)")
    return parts
