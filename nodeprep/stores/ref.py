"""`oci://HOST[:PORT]/REPO[@sha256:HEX]` store references (pure parsing and validation)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace

from ..errors import InputError
from ..urls import plain_http_allowed

# Distribution spec: repository name components and the tag grammar.
_REPO_RE = re.compile(r"^[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*$")
_HOST_RE = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?)(:\d{1,5})?$")
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_TAG_BAD = re.compile(r"[^A-Za-z0-9_.-]")
TAG_MAX = 128


@dataclass(frozen=True)
class OciRef:
    """A registry repository, the scheme to reach it by, and an optional pinned index digest."""

    host: str  # host[:port] as written (brackets kept for IPv6)
    repository: str
    plain_http: bool = False
    digest: str | None = None  # pins the index artifact's manifest

    @property
    def hostname(self) -> str:
        host = self.host.rsplit(":", 1)[0] if not self.host.endswith("]") and ":" in self.host \
            else self.host
        return host.strip("[]")

    @property
    def base_url(self) -> str:
        return f"{'http' if self.plain_http else 'https'}://{self.host}/v2/"

    @property
    def repo_url(self) -> str:
        return f"{self.base_url}{self.repository}/"

    def name_of(self, reference: str) -> str:
        """`oci://host/repo:tag` or `oci://host/repo@sha256:...` for a reference in this repository."""
        base = str(replace(self, digest=None))
        return f"{base}@{reference}" if reference.startswith("sha256:") else f"{base}:{reference}"

    def __str__(self) -> str:
        scheme = "oci+http" if self.plain_http else "oci"
        return f"{scheme}://{self.host}/{self.repository}" + (f"@{self.digest}" if self.digest else "")


def parse_ref(location: str, *, insecure_http: bool = False, what: str = "--store") -> OciRef:
    """Parse and validate an `oci://` / `oci+http://` location. Plain http is refused unless the
    registry is on loopback or `insecure_http` is set."""
    if location.startswith("oci+http://"):
        plain, rest = True, location[len("oci+http://"):]
    elif location.startswith("oci://"):
        plain, rest = insecure_http, location[len("oci://"):]
    else:
        raise InputError(f"{what}: {location!r} is not an oci:// reference")
    rest, _, digest = rest.partition("@")
    host, _, repo = rest.partition("/")
    repo = repo.rstrip("/")
    if not _HOST_RE.fullmatch(host):
        raise InputError(f"{what}: {location!r}: {host!r} is not a registry host[:port]")
    if ":" in host and not host.endswith("]"):
        port = host.rsplit(":", 1)[1]
        if not 0 < int(port) < 65536:
            raise InputError(f"{what}: {location!r}: port {port} is out of range")
    if not repo or not _REPO_RE.fullmatch(repo) or len(repo) > 255:
        raise InputError(f"{what}: {location!r}: {repo!r} is not a repository name (lowercase "
                         f"letters, digits, separators . _ - and /)")
    if digest and not _DIGEST_RE.fullmatch(digest):
        raise InputError(f"{what}: {location!r}: {digest!r} is not sha256:<64 lowercase hex digits>")
    ref = OciRef(host=host, repository=repo, plain_http=plain, digest=digest or None)
    if plain and not plain_http_allowed(ref.hostname, insecure_http=insecure_http):
        raise InputError(f"{what}: {location!r}: plain http to a registry that is not on loopback "
                         f"needs --insecure-http")
    return ref


def tag_for(name: str) -> str:
    """The tag an artifact file name is published under: characters outside the tag grammar
    become '_', a leading '.' or '-' gets a '_' in front, and names over 128 characters are cut
    with a short digest of the full name, so distinct names keep distinct tags."""
    tag = _TAG_BAD.sub("_", name)
    if not tag or tag[0] in ".-":
        tag = "_" + tag
    if len(tag) > TAG_MAX:
        tag = tag[: TAG_MAX - 13] + "-" + hashlib.sha256(name.encode()).hexdigest()[:12]
    return tag
