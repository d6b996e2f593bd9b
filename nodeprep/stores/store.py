"""Reading a store, whatever it is: a directory, file:// or http(s):// base URL with index.json, or
an OCI registry repository (`oci://`, nodeprep/stores/oci.py): install, the kernel hook, bootstrap,
the Ansible driver module and `artifacts list` read every store through `Store`. A directory store is
read by `artifact.read_index`/`sha256_listed`, which `Store`, `LocalStore` (build-driver,
build-matrix, the build module), `artifacts verify` and `artifacts push` share.

A store's names are data, never paths: every index entry is type-checked and its name must be the
single file name its fields give (artifact.parse_index). A directory store's index and artifacts are
opened as regular files without following a symbolic link; a download is written as
`<cache_dir>/<validated name>` (`cache_path`) and nowhere else.

Every artifact is checked twice: its sha256 against the store index (here), and each file inside
against the artifact's manifest (artifact.extract). A registry adds a third check: each manifest
against the digest the index artifact recorded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .. import download
from ..artifact import INDEX, MAX_INDEX, IndexEntry, file_name, parse_index, read_index, sha256_listed
from ..errors import ChecksumError
from ..profile.fields import field_error
from ..stores import auth
from ..urls import is_loopback, parse_store_location, redact_url
from . import is_oci
from .oci import OciStore, Options, connect

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
            self._oci.append(OciStore(connect(self.location, self.options)))
        return self._oci[0]

    def entries(self) -> list[IndexEntry]:
        if is_oci(self.location):
            return list(self._registry().entries())
        local = self.local
        if local is not None:
            if not local.is_dir():
                raise field_error("driver.store", f"{local} is not a directory")
            entries = read_index(local)
            if entries is None:
                raise field_error("driver.store", f"{local / INDEX} not found (not an artifact store)")
            return entries
        raw = download.fetch_bytes(self.index_url(), verify=self._verify, headers=self._headers(),
                                   limit=MAX_INDEX, insecure_http=self.options.insecure_http)
        return parse_index(raw, source=redact_url(self.index_url()))

    def fetch(self, entry: IndexEntry, cache_dir: Path) -> Path:
        """A local, sha256-verified copy of `entry` (the store file itself for a local store), at
        `cache_dir/<entry.name>` for a remote one."""
        dest = cache_path(cache_dir, entry)
        if is_oci(self.location):
            return Path(self._registry().fetch(entry, dest))
        local = self.local
        if local is not None:
            path = local / dest.name
            actual = sha256_listed(local, dest.name)
            if actual is None:
                raise field_error("driver.store", f"{path} is listed in the index but missing")
            if actual != entry.sha256:
                raise ChecksumError(f"{path}: sha256 {actual} does not match the store index {entry.sha256}")
            return path
        url = self.location.rstrip("/") + "/" + dest.name
        return download.download(url, dest, sha256=entry.sha256, size=entry.size,
                                 verify=self._verify, headers=self._headers(),
                                 insecure_http=self.options.insecure_http)

    @property
    def _verify(self) -> bool | str:
        return self.options.ca_file or True

    def _headers(self) -> dict[str, str]:
        """Basic credentials for an http(s) store from the credentials file (same file and format
        as for registries), sent only over https or to loopback."""
        path = auth.resolve_path(self.options.registry_auth)
        if path is None:
            return {}
        parts = urlsplit(self.location)
        creds = auth.load(path, parts.netloc)
        if creds is None:
            return {}
        if parts.scheme != "https" and not is_loopback(parts.hostname or ""):
            raise field_error("driver.store", f"{self.location}: credentials are only sent over https (or to "
                              f"loopback)")
        if creds.username is None or creds.password is None:
            raise field_error("driver.registry_auth", f"the entry for {parts.netloc} has no "
                              f"username/password (an http store takes basic credentials)")
        return {"Authorization": auth.basic_header(creds)}


def cache_path(cache_dir: Path, entry: IndexEntry) -> Path:
    """Where a fetched `entry` is kept: `cache_dir/<its name>`, the name checked again here (an entry
    made in code is not parsed), so nothing is written or removed anywhere else."""
    return cache_dir / file_name(entry.name)
