"""URLs that may carry credentials: detect and redact `user:password@` before anything is shown.

nodeprep refuses credentials inside a store URL (docs/profile.md: they belong in a credentials file,
like the bootstrap token); `redact_url` is applied wherever a URL is logged or put into an error, so
even a URL that reaches a message by another route never shows its userinfo.
"""

from __future__ import annotations

import re

REDACTED = "<redacted>"
_USERINFO_RE = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#@]*)@")


def has_userinfo(url: str) -> bool:
    """True when `url` has a `user[:password]@` part in its authority."""
    return bool(_USERINFO_RE.match(url))


def redact_url(text: str) -> str:
    """`text` with the userinfo of every URL in it replaced by <redacted>."""
    return _USERINFO_RE.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
