"""Artifact stores reached over a network protocol of their own (OCI registries).

Directory and http(s) stores live in nodeprep/artifact.py (LocalStore, publishing) and
nodeprep/node/store.py (reading); `nodeprep.node.store.Store` dispatches `oci://` locations here.
"""

from __future__ import annotations

OCI_SCHEMES = ("oci://", "oci+http://")


def is_oci(location: str) -> bool:
    """True for an `oci://` or `oci+http://` store location."""
    return location.startswith(OCI_SCHEMES)
