"""Artifact stores: the one reader (`store.Store`: directory, http(s) and `oci://` alike), the OCI
registry client (`oci`, `registry`, `auth`, `ref`, `redirects`) and store verification (`verify`).

The directory store's format and its writer are nodeprep/artifact.py (`LocalStore`, the index);
publishing to a registry is nodeprep/builder/publish.py.
"""

from __future__ import annotations

OCI_SCHEMES = ("oci://", "oci+http://")


def is_oci(location: str) -> bool:
    """True for an `oci://` or `oci+http://` store location."""
    return location.startswith(OCI_SCHEMES)
