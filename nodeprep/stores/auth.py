"""Registry credentials from a docker-style `config.json`, and `WWW-Authenticate` parsing.

The file is named by path (`--registry-auth`, the profile's `driver.registry_auth`, or
NODEPREP_REGISTRY_AUTH), never given inline; like the bootstrap-token file it is refused when
group or others may read or write it. Supported entries under `auths`: `auth` (base64
user:password), `username`/`password`, and `identitytoken` (an OAuth2 refresh token for the
bearer flow). Credential helpers (`credsStore`, `credHelpers`) are not run.
"""

from __future__ import annotations

import base64
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError

ENV_AUTH = "NODEPREP_REGISTRY_AUTH"


@dataclass(frozen=True)
class Credentials:
    username: str | None = None
    password: str | None = None
    identity_token: str | None = None

    def __repr__(self) -> str:  # never print secrets, not even in a traceback
        return f"Credentials(username={self.username!r}, secret=***)"


@dataclass(frozen=True)
class Challenge:
    scheme: str  # "bearer" or "basic"
    params: dict[str, str]


def check_private(path: Path, what: str) -> None:
    """Refuse a secret file that group or others may read or write."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise InputError(f"{what}: {path} does not exist") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{what}: {path} is not a regular file")
    if st.st_mode & 0o077:
        raise InputError(f"{what}: {path} is readable or writable by group/others (mode "
                         f"{stat.S_IMODE(st.st_mode):04o}); chmod 600 it")


def load(path: Path | str, host: str, *, what: str = "--registry-auth") -> Credentials | None:
    """The credentials for registry `host` (host[:port]) in the config file `path`, or None."""
    path = Path(path)
    check_private(path, what)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{what}: {path}: not a JSON credentials file ({type(e).__name__})") from None
    if not isinstance(data, dict):
        raise InputError(f"{what}: {path}: not a JSON object")
    auths = data.get("auths", {})
    if not isinstance(auths, dict):
        raise InputError(f"{what}: {path}: 'auths' is not an object")
    for key, entry in auths.items():
        if _host_of(key) != host.lower() or not isinstance(entry, dict):
            continue
        return _entry(entry, path, key, what)
    helpers = data.get("credHelpers") or {}
    if isinstance(helpers, dict) and host in helpers or data.get("credsStore"):
        raise InputError(f"{what}: {path}: {host} is only served by a credential helper, which nodeprep "
                         f"does not run; put the credentials under 'auths'")
    return None


def _host_of(key: str) -> str:
    key = re.sub(r"^[a-z]+://", "", key.strip().lower())
    return key.split("/", 1)[0]


def _entry(entry: dict[str, object], path: Path, key: str, what: str) -> Credentials:
    token = entry.get("identitytoken")
    if isinstance(token, str) and token:
        user = entry.get("username")
        return Credentials(username=user if isinstance(user, str) else None, identity_token=token)
    raw = entry.get("auth")
    if isinstance(raw, str) and raw:
        try:
            user, sep, password = base64.b64decode(raw, validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            raise InputError(f"{what}: {path}: auths[{key!r}].auth is not base64 of user:password") from None
        if not sep:
            raise InputError(f"{what}: {path}: auths[{key!r}].auth is not base64 of user:password")
        return Credentials(username=user, password=password)
    username, secret = entry.get("username"), entry.get("password")
    if isinstance(username, str) and isinstance(secret, str):
        return Credentials(username=username, password=secret)
    raise InputError(f"{what}: {path}: auths[{key!r}] has no auth, username/password or identitytoken")


def resolve_path(given: str | Path | None) -> Path | None:
    """The credentials file to use: the given path, else $NODEPREP_REGISTRY_AUTH, else none."""
    if given:
        return Path(given)
    env = os.environ.get(ENV_AUTH)
    return Path(env) if env else None


_PARAM_RE = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_-]*)\s*=\s*("(?:[^"\\]|\\.)*"|[^,\s]*)\s*,?')


def parse_challenge(header: str) -> Challenge | None:
    """The first challenge of a `WWW-Authenticate` header (Bearer realm=...,service=...,scope=...)."""
    scheme, _, rest = header.strip().partition(" ")
    if not scheme:
        return None
    params: dict[str, str] = {}
    for m in _PARAM_RE.finditer(rest):
        value = m.group(2)
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        params[m.group(1).lower()] = value
    return Challenge(scheme=scheme.lower(), params=params)


def basic_header(creds: Credentials) -> str:
    pair = f"{creds.username or ''}:{creds.password or ''}".encode()
    return "Basic " + base64.b64encode(pair).decode()
