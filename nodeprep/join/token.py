"""The bootstrap token: read from a root-owned 0600 file, validated, never logged.

Policy (docs/join.md): the token file must exist, be a regular file and must not be readable or
writable by group or others — nodeprep refuses (InputError, exit 2) rather than warns, because a
token readable by other users lets them join arbitrary machines to the cluster.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError

TOKEN_RE = re.compile(r"^([a-z0-9]{6})\.([a-z0-9]{16})$")
MASK = "<redacted>"
MAX_TOKEN_FILE = 4096


@dataclass(frozen=True)
class BootstrapToken:
    """A validated token. repr/str never show the secret part."""

    id: str
    _secret: str

    @property
    def value(self) -> str:
        return f"{self.id}.{self._secret}"

    @property
    def masked(self) -> str:
        return f"{self.id}.{'*' * 16}"

    def __repr__(self) -> str:
        return f"BootstrapToken(id={self.id!r}, secret=<redacted>)"

    __str__ = __repr__


def parse_token(text: str, *, source: str) -> BootstrapToken:
    value = text.strip()
    m = TOKEN_RE.fullmatch(value)
    if not m:
        # Never echo the content: it may be a real token with a typo.
        raise InputError(
            f"{source}: not a bootstrap token (expected [a-z0-9]{{6}}.[a-z0-9]{{16}}, "
            f"e.g. abcdef.0123456789abcdef; got {len(value)} characters)"
        )
    return BootstrapToken(m.group(1), m.group(2))


def read_token_file(
    path: Path, *, shown_as: str | None = None, field: str = "cluster.token_file"
) -> BootstrapToken:
    """Read and validate the token file at `path` (host path): the one check every command that
    takes a token file applies (`join`, `bootstrap`, `cloud-init --token-file`). `shown_as` is the
    path named in errors (the node's view, without --root); `field` the setting or flag named."""
    name = shown_as or str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        raise InputError(
            f"{field}: {name} does not exist",
            hint="write the token there with mode 0600 (install -m 0600 /dev/stdin FILE)",
        ) from None
    except OSError as e:
        raise InputError(f"{field}: {name}: cannot read ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{field}: {name} is not a regular file")
        if st.st_mode & 0o077:
            raise InputError(
                f"{field}: {name} has mode {stat.S_IMODE(st.st_mode):04o}; the bootstrap "
                "token must not be readable by group or others",
                hint=f"chmod 0600 {path}",  # the file as this host sees it: under --root
            )
        raw = os.read(fd, MAX_TOKEN_FILE + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_TOKEN_FILE:
        raise InputError(f"{field}: {name} is larger than {MAX_TOKEN_FILE} bytes (not a bootstrap token)")
    return parse_token(raw.decode("utf-8", errors="replace"), source=f"{field}: {name}")


def redact(text: str, token: BootstrapToken | None) -> str:
    """`text` with the token (and its secret half) replaced."""
    if token is None:
        return text
    return text.replace(token.value, MASK).replace(token._secret, MASK)
