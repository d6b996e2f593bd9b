"""Command-line overrides of profile fields, merged into a loaded profile and validated like a file."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from .fields import field_by_path, field_error
from .load import parse_profile
from .model import Driver, Profile


def with_overrides(profile: Profile, overrides: Mapping[str, Any], *,
                   insecure_skip_ca_verification: bool = False) -> Profile:
    """A new Profile with `section.key` values replaced (command-line flags); None values are
    ignored. The result is validated like a file."""
    given = {path: value for path, value in overrides.items() if value is not None}
    if not given:
        return profile
    data = profile.to_dict()
    for path, value in given.items():
        f = field_by_path(path)
        data.setdefault(f.section, {})[f.key] = value
    return parse_profile(data, f"{profile.source} + command line",
                         insecure_skip_ca_verification=insecure_skip_ca_verification)


def section_with(base: Any, section: str, overrides: Mapping[str, Any]) -> Any:
    """`base`, a dataclass whose fields are `section`'s keys, with the `section.KEY` values given
    (None: not given) in place of its fields: the one way a front-end's flags or task options become
    a typed section. Each value is held to its field's rule, as a profile file's is: the first problem
    is the error (InputError naming the field and its flag)."""
    unknown = [path for path in overrides if not path.startswith(f"{section}.")]
    if unknown:
        raise KeyError(", ".join(unknown))
    given: dict[str, Any] = {}
    for path, value in overrides.items():
        if value is None:
            continue
        f = field_by_path(path)
        _, problems = f.parse(list(value) if isinstance(value, tuple) else value)
        if problems:
            raise field_error(path, problems[0])
        given[f.key] = value
    return replace(base, **given)


def driver_with(base: Driver, overrides: Mapping[str, Any]) -> Driver:
    """`base` with the `driver.KEY` values given: node/driververbs.py's requests."""
    driver: Driver = section_with(base, "driver", overrides)
    return driver
