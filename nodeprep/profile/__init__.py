"""The node profile: one YAML file describing a node's wanted state (docs/profile.md).

- model.py: the immutable sections (Driver, Labels, Cluster, Runtime, Profile) and value domains;
- rules.py: validator combinators, each carrying the JSON Schema fragment that says the same;
- checks.py: the field checks beyond shape (paths, stores, endpoints, taints, labels, modules);
- fields.py: FIELDS, one row per field (YAML path, rule, help, optional command-line flag);
- load.py: reading and validating a file (every problem in one ProfileError, exit 2);
- overrides.py: command-line values merged in and validated like a file;
- schema.py: the JSON Schema, derived from FIELDS (nodeprep/data/profile.schema.json).
The click options for the overrides live in nodeprep/commands/clioptions.py.
"""

from __future__ import annotations

from .fields import FIELDS, REQUIRED_SECTIONS, SECTION_HELP, Field, field_by_path
from .load import DEFAULT_PATH, MAX_PROBLEMS, load_profile, parse_profile, profile_path, read_profile
from .model import (
    GPU_TAINT,
    SECTIONS,
    UNHEALTHY_TAINT,
    UNVERIFIED_TAINT,
    Cluster,
    Driver,
    Labels,
    Profile,
    Runtime,
    Taint,
)
from .overrides import with_overrides
from .schema import SCHEMA_PATH, json_schema, render_schema

__all__ = [
    "DEFAULT_PATH",
    "FIELDS",
    "GPU_TAINT",
    "MAX_PROBLEMS",
    "REQUIRED_SECTIONS",
    "SCHEMA_PATH",
    "SECTIONS",
    "SECTION_HELP",
    "UNHEALTHY_TAINT",
    "UNVERIFIED_TAINT",
    "Cluster",
    "Driver",
    "Field",
    "Labels",
    "Profile",
    "Runtime",
    "Taint",
    "field_by_path",
    "json_schema",
    "load_profile",
    "parse_profile",
    "profile_path",
    "read_profile",
    "render_schema",
    "with_overrides",
]
