"""Reading artifacts from a store (a directory, file:// or http(s):// base URL with index.json).

Every artifact is checked twice: its sha256 against the store index (here), and each file inside
against the artifact's manifest (artifact.extract).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from .. import download
from ..artifact import INDEX, IndexEntry, parse_index, sha256_file
from ..errors import ChecksumError, InputError
from ..urls import has_userinfo, redact_url

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Store:
    location: str

    def __post_init__(self) -> None:
        if has_userinfo(self.location):
            raise InputError(f"--store: {redact_url(self.location)}: credentials in the URL are refused",
                             hint="give them in a credentials file instead (docs/profile.md)")

    @property
    def local(self) -> Path | None:
        return download.local_path(self.location)

    def index_url(self) -> str:
        return self.location.rstrip("/") + "/" + INDEX

    def entries(self) -> list[IndexEntry]:
        local = self.local
        if local is not None:
            if not local.is_dir():
                raise InputError(f"--store: {local} is not a directory")
            index = local / INDEX
            if not index.is_file():
                raise InputError(f"--store: {index} not found (not an artifact store)")
            return parse_index(index.read_bytes(), source=str(index))
        return parse_index(download.fetch_bytes(self.index_url()), source=redact_url(self.index_url()))

    def fetch(self, entry: IndexEntry, cache_dir: Path) -> Path:
        """A local, sha256-verified copy of `entry` (the store file itself for a local store)."""
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
        return download.download(url, cache_dir / entry.name, sha256=entry.sha256)
