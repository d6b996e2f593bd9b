"""The profile's JSON Schema (published at nodeprep/data/profile.schema.json; a test keeps it in
step), derived from the field table: each field's rule gives its fragment, the model its default."""

from __future__ import annotations

import json
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from .fields import FIELDS, REQUIRED_SECTIONS, SECTION_HELP
from .model import SECTIONS, to_plain

SCHEMA_PATH = Path(__file__).parent.parent / "data" / "profile.schema.json"


def json_schema() -> dict[str, Any]:
    props: dict[str, Any] = {}
    for name, cls in SECTIONS.items():
        table = [f for f in FIELDS if f.section == name]
        section_props = {}
        for f in table:
            prop = dict(f.schema)
            prop["description"] = f.help
            default = _default_of(cls, f.key)
            if default is not _NO_DEFAULT:
                prop["default"] = to_plain(default)
            section_props[f.key] = prop
        props[name] = {
            "type": "object",
            "description": SECTION_HELP[name],
            "additionalProperties": False,
            "required": [f.key for f in table if f.required],
            "properties": section_props,
        }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://nodeprep.invalid/schemas/profile.schema.json",
        "title": "nodeprep node profile",
        "description": "A node's wanted state: driver, labels, cluster join, runtime (docs/profile.md)",
        "type": "object",
        "additionalProperties": False,
        "required": list(REQUIRED_SECTIONS),
        "properties": props,
    }


_NO_DEFAULT = object()


def _default_of(cls: type, key: str) -> Any:
    for f in fields(cls):
        if f.name == key:
            if f.default is not MISSING:
                return f.default
            if f.default_factory is not MISSING:
                return f.default_factory()
    return _NO_DEFAULT


def render_schema() -> str:
    return json.dumps(json_schema(), indent=2) + "\n"
