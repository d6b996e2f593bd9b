"""Validation rules of the profile's fields, each with the JSON Schema fragment that accepts the same
shapes. A Rule is called as `rule(value) -> (parsed, problems)`; problems are messages without the
field's path (the parser prefixes `section.key: `). The combinators (string, enum, boolean, list_of,
mapping, integer) build both halves from the same arguments, so the published schema cannot disagree with
the parser about types, patterns, choices or item shapes; a rule with a check the schema cannot say
(a host:port, a label key) keeps the schema of its shape.
"""

from __future__ import annotations

import difflib
import re
import reprlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..urls import redact_url


class Problem(str):
    """A problem message that remembers where below its field it was found (`at`: map keys and
    list indexes), so the parser can name the line."""

    at: tuple[Any, ...] = ()

    @classmethod
    def under(cls, step: Any, text: str, inner: str) -> Problem:
        p = cls(text)
        p.at = (step, *getattr(inner, "at", ()))
        return p


Problems = list[str]
Check = Callable[[Any], tuple[Any, Problems]]


@dataclass(frozen=True)
class Rule:
    """A validator and the JSON Schema fragment that says the same."""

    check: Check
    schema: Mapping[str, Any]

    def __call__(self, value: Any) -> tuple[Any, Problems]:
        return self.check(value)


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxtuple = 2, 4, 4, 4


def name_of(key: Any) -> str:
    """A mapping key as written when it is a short printable string, else a bounded repr."""
    return key if isinstance(key, str) and len(key) <= 80 and key.isprintable() else show(key)


def show(value: Any) -> str:
    """A bounded repr for messages (values may be huge or alias-shared structures); URLs redacted."""
    return redact_url(_REPR.repr(value))


def type_name(value: Any) -> str:
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "list",
        dict: "mapping",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def string(
    pattern: re.Pattern[str] | None = None,
    expected: str = "",
    check: Callable[[str], str | None] | None = None,
    nullable: bool = False,
) -> Rule:
    """A string (or null when `nullable`) matching `pattern` (`expected` says what it is not), then
    passing `check` (a message or None)."""

    def parse(value: Any) -> tuple[Any, Problems]:
        if value is None and nullable:
            return None, []
        if isinstance(value, int | float) and not isinstance(value, bool) and pattern is not None:
            return value, [f"{show(value)} must be a quoted string (YAML read it as a number)"]
        if not isinstance(value, str):
            return value, [f"expected a string, got {type_name(value)}"]
        if pattern is not None and not pattern.fullmatch(value):
            return value, [f"{show(value)} {expected}"]
        if check is not None and (problem := check(value)):
            return value, [problem]
        return value, []

    schema: dict[str, Any] = {"type": ["string", "null"] if nullable else "string"}
    if pattern is not None:
        schema["pattern"] = pattern.pattern
    return Rule(parse, schema)


def enum(*choices: str) -> Rule:
    def parse(value: Any) -> tuple[Any, Problems]:
        if value not in choices:
            hint = difflib.get_close_matches(value[:80], choices, n=1) if isinstance(value, str) else []
            extra = f" (did you mean {hint[0]!r}?)" if hint else ""
            return value, [f"{show(value)} is not one of {', '.join(choices)}{extra}"]
        return value, []

    return Rule(parse, {"enum": list(choices)})


def _bool(value: Any) -> tuple[Any, Problems]:
    if not isinstance(value, bool):
        return value, [f"expected true or false, got {show(value)}"]
    return value, []


boolean = Rule(_bool, {"type": "boolean"})


def integer(low: int, high: int) -> Rule:
    """A whole number from `low` to `high` (a bool is none)."""

    def parse(value: Any) -> tuple[Any, Problems]:
        if not isinstance(value, int) or isinstance(value, bool):
            return value, [f"expected a whole number, got {type_name(value)}"]
        if not low <= value <= high:
            return value, [f"{value} is not from {low} to {high}"]
        return value, []

    return Rule(parse, {"type": "integer", "minimum": low, "maximum": high})


def list_of(item: Rule) -> Rule:
    """A list (parsed to a tuple) of `item`s; problems name the index."""

    def parse(value: Any) -> tuple[Any, Problems]:
        if not isinstance(value, list | tuple):
            return value, [f"expected a list, got {type_name(value)}"]
        out: list[Any] = []
        problems: Problems = []
        for i, v in enumerate(value):
            parsed, errs = item(v)
            out.append(parsed)
            problems += [Problem.under(i, f"[{i}]: {e}", e) for e in errs]
        return tuple(out), problems

    return Rule(parse, {"type": "array", "items": dict(item.schema)})


def mapping(
    value_rule: Rule,
    key_check: Callable[[str], str | None] | None = None,
    pair_check: Callable[[str, Any], list[str]] | None = None,
) -> Rule:
    """A mapping of string keys (checked by `key_check`) to `value_rule` values (the pair checked by
    `pair_check` once the value is valid); null is an empty mapping."""

    def parse(value: Any) -> tuple[Any, Problems]:
        if value is None:
            return {}, []
        if not isinstance(value, dict):
            return value, [f"expected a mapping, got {type_name(value)}"]
        out: dict[str, Any] = {}
        problems: Problems = []
        for k, v in value.items():
            if not isinstance(k, str):
                problems.append(Problem.under(k, f"key {show(k)} must be a string", ""))
                continue
            if key_check is not None and (problem := key_check(k)):
                problems.append(Problem.under(k, problem, ""))
            parsed, errs = value_rule(v)
            problems += [Problem.under(k, f"{show(k)}: {e}", e) for e in errs]
            if not errs and pair_check is not None:
                problems += [Problem.under(k, e, "") for e in pair_check(k, parsed)]
            out[k] = parsed
        return out, problems

    return Rule(parse, {"type": "object", "additionalProperties": dict(value_rule.schema)})
