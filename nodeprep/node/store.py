"""Reading artifacts from a store: a directory, file:// or http(s):// base URL with index.json, or
an OCI registry repository (`oci://`, nodeprep/stores/oci.py).

Every artifact is checked twice: its sha256 against the store index (here), and each file inside
against the artifact's manifest (artifact.extract). A registry adds a third check: each manifest
against the digest the index artifact recorded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import download
from ..artifact import INDEX, IndexEntry, parse_index, sha256_file
from ..errors import ChecksumError, InputError
from ..stores import is_oci
from ..stores.oci import Options
from ..urls import parse_store_location, redact_url

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Store:
    location: str
    options: Options = field(default_factory=Options)
    _oci: list[Any] = field(default_factory=list, compare=False, repr=False)

    def __post_init__(self) -> None:  # normalised and checked once, before anything connects
        object.__setattr__(self, "location", parse_store_location(
            self.location, insecure_http=self.options.insecure_http))

    @property
    def local(self) -> Path | None:
        if is_oci(self.location):
            return None
        return download.local_path(self.location)

    def index_url(self) -> str:
        return self.location.rstrip("/") + "/" + INDEX

    def _registry(self) -> Any:
        if not self._oci:
            from ..stores.oci import OciStore, connect

            self._oci.append(OciStore(connect(self.location, self.options)))
        return self._oci[0]

    def entries(self) -> list[IndexEntry]:
        if is_oci(self.location):
            return list(self._registry().entries())
        local = self.local
        if local is not None:
            if not local.is_dir():
                raise InputError(f"--store: {local} is not a directory")
            index = local / INDEX
            if not index.is_file():
                raise InputError(f"--store: {index} not found (not an artifact store)")
            return parse_index(index.read_bytes(), source=str(index))
        raw = download.fetch_bytes(self.index_url(), verify=self._verify, headers=self._headers(),
                                   insecure_http=self.options.insecure_http)
        return parse_index(raw, source=redact_url(self.index_url()))

    def fetch(self, entry: IndexEntry, cache_dir: Path) -> Path:
        """A local, sha256-verified copy of `entry` (the store file itself for a local store)."""
        if is_oci(self.location):
            return Path(self._registry().fetch(entry, cache_dir))
        local = self.local
        if local is not None:
            path = local / entry.name
            if not path.is_file():
                raise InputError(f"--store: {path} is listed in the index but missing")
            actual = sha256_file(path)
            if actual != entry.sha256:
                raise ChecksumError(f"{path}: sha256 {actual} does not match the store index {entry.sha256}")
            return path
        url = self.location.rstrip("/") + "/" + entry.name
        return download.download(url, cache_dir / entry.name, sha256=entry.sha256, size=entry.size,
                                 verify=self._verify, headers=self._headers(),
                                 insecure_http=self.options.insecure_http)

    @property
    def _verify(self) -> bool | str:
        return self.options.ca_file or True

    def _headers(self) -> dict[str, str]:
        """Basic credentials for an http(s) store from the credentials file (same file and format
        as for registries), sent only over https or to loopback."""
        from urllib.parse import urlsplit

        from ..stores import auth
        from ..urls import is_loopback

        path = auth.resolve_path(self.options.registry_auth)
        if path is None:
            return {}
        parts = urlsplit(self.location)
        creds = auth.load(path, parts.netloc)
        if creds is None:
            return {}
        if parts.scheme != "https" and not is_loopback(parts.hostname or ""):
            raise InputError(f"--store: {self.location}: credentials are only sent over https (or to "
                             f"loopback)")
        if creds.username is None or creds.password is None:
            raise InputError(f"--registry-auth: the entry for {parts.netloc} has no username/password "
                             f"(an http store takes basic credentials)")
        return {"Authorization": auth.basic_header(creds)}
