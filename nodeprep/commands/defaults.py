"""The node commands' settings from the profile: a field the command line leaves out comes from the
profile (`--profile`, else /etc/nodeprep/node.yaml under --root when it exists); a flag overrides it.
One table of names: each setting is a profile field, given on the command line as its `flag`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import InputError
from ..profile.fields import field_by_path, field_error
from ..profile.load import parse_profile, profile_path, read_profile


def from_profile(root: Path, profile: Path | None, given: dict[str, Any]) -> dict[str, Any]:
    """`given` (field path -> command-line value, None when not given) with each None replaced by
    the profile's value when the profile file sets that field. An explicit --profile must exist; a
    profile is validated whole (exit 2 naming the file and field)."""
    path = profile_path(root, profile)
    if profile is None and not path.is_file():
        return dict(given)
    _, document = read_profile(path)
    # driver commands do not judge the cluster's CA pin: `join` refuses a kubeadm join without one
    prof = parse_profile(document.data, str(path), document, insecure_skip_ca_verification=True)
    out = dict(given)
    for field_path, value in given.items():
        f = field_by_path(field_path)
        section = document.data.get(f.section) if isinstance(document.data, dict) else None
        if value is None and isinstance(section, dict) and f.key in section:
            out[field_path] = getattr(getattr(prof, f.section), f.key)
    return out


def required(values: dict[str, Any], field_path: str, *, given_as: str | None = None) -> Any:
    """The value of `field_path`, or an error naming its flag (or `given_as`, an argument) and field
    when neither the command line nor the profile gives it."""
    value = values.get(field_path)
    if value is None:
        message = f"missing (give it or set {field_path} in the profile)"
        if given_as:
            raise InputError(message, field=field_path, flag=given_as)
        raise field_error(field_path, message)
    return value
