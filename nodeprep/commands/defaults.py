"""The node commands' profile: a driver setting the command line leaves out comes from the profile
(`--profile`, else /etc/nodeprep/node.yaml under --root when it exists) when the file sets it; a flag
(the field table's, nodeprep/profile/fields.py) overrides it. The result is the typed Driver section
the use cases (nodeprep/node/driververbs.py) take."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from ..profile.load import parse_profile, profile_path, read_profile
from ..profile.model import UNSET_DRIVER, Driver, Profile
from ..profile.overrides import driver_with

UNSET = UNSET_DRIVER  # what the command line starts from


def node_profile(root: Path, profile: Path | None) -> tuple[Profile, set[str]] | None:
    """The profile and the driver keys its file sets; None without one. An explicit --profile must
    exist; a profile is validated whole (exit 2 naming the file and field)."""
    path = profile_path(root, profile)
    if profile is None and not path.is_file():
        return None
    _, document = read_profile(path)
    # driver commands do not judge the cluster's CA pin: `join` refuses a kubeadm join without one
    prof = parse_profile(document.data, str(path), document, insecure_skip_ca_verification=True)
    section = document.data.get("driver") if isinstance(document.data, dict) else None
    return prof, set(section) if isinstance(section, dict) else set()


def node_driver(root: Path, profile: Path | None, overrides: dict[str, Any]) -> Driver:
    """The Driver section: the profile file's fields over UNSET, the flags (`overrides`, field path ->
    value, None when not given) over those."""
    base = UNSET
    found = node_profile(root, profile)
    if found is not None:
        prof, keys = found
        base = replace(UNSET, **{f.name: getattr(prof.driver, f.name) for f in fields(Driver)
                                 if f.name in keys})
    return driver_with(base, overrides)
