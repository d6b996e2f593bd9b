"""Every file derived from the field table (fields.py), rewritten from it: the JSON Schema, the
docs' field table, the example profile's driver section, and the Ansible files that cannot import
nodeprep (nodeprep_driver's options and DOCUMENTATION, the nvidia_driver role's defaults, argument
specs, install task and the handler that loads the modules). A file written by hand keeps its own
text outside the markers.

    python -m nodeprep.profile.generate --write   # rewrite them
    python -m nodeprep.profile.generate --check   # exit 1 naming each stale file

tests/unit/test_derived_files.py fails on a stale file, naming this command."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Callable
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from ..atomicfile import atomic_write
from .fields import FIELDS, Field
from .model import SECTIONS, UNSET_DRIVER, to_plain
from .schema import SCHEMA_PATH, render_schema

REPO = Path(__file__).resolve().parents[2]
COMMAND = "python -m nodeprep.profile.generate --write"
BEGIN = f"BEGIN generated from nodeprep/profile/fields.py by `{COMMAND}`"
END = "END generated"
COLLECTION = "collections/ansible_collections/nodeprep/fleet/plugins"
ROLE = "roles/nvidia_driver"
NO_DEFAULT = object()


def default_of(f: Field, *, unset: bool = False) -> Any:
    """The model's default of `f` (NO_DEFAULT: required); `unset`: the front-ends' start instead for
    the driver section (no flavour: whichever the store has)."""
    if unset and f.section == "driver":
        return to_plain(getattr(UNSET_DRIVER, f.key))
    for d in fields(SECTIONS[f.section]):
        if d.name == f.key:
            if d.default is not MISSING:
                return to_plain(d.default)
            if d.default_factory is not MISSING:
                return to_plain(d.default_factory())
    return NO_DEFAULT


def installed() -> list[Field]:
    """The driver fields the Ansible driver module and role take."""
    return [f for f in FIELDS if f.section == "driver" and f.ansible]


def _flow(value: Any) -> str:
    """A YAML value on one line."""
    if isinstance(value, list):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and (value == "" or not value.replace("-", "").replace("_", "").isalnum()
                                   or value[0].isdigit() or value in ("null", "true", "false", "yes", "no")):
        return json.dumps(value)
    return str(value)


def _comment(text: str, indent: str, width: int = 100) -> list[str]:
    return textwrap.wrap(text, width, initial_indent=f"{indent}# ", subsequent_indent=f"{indent}# ")


def docs_table() -> list[str]:
    """docs/profile.md's table: field, default, flag and the commands offering it, meaning."""
    rows = ["| field | default | flag | meaning |", "|---|---|---|---|"]
    for f in FIELDS:
        default = default_of(f)
        shown = "required" if f.required or default is NO_DEFAULT else f"`{json.dumps(default)}`"
        flag = f"`{f.flag}` ({', '.join(f'`{c}`' for c in f.commands)})" if f.flag else ""
        rows.append(f"| `{f.path}` | {shown} | {flag} | {f.doc or f.help} |")
    return rows


def example_driver() -> list[str]:
    """examples/node.yaml's driver section: each field, its help as the comment above it."""
    lines = ["driver:"]
    for f in FIELDS:
        if f.section == "driver":
            value = f.example if f.example is not None else _flow(default_of(f))
            lines += [*_comment(f.help, "  "), f"  {f.key}: {value}"]
    return lines


def _schema(f: Field) -> dict[str, Any]:
    return dict(f.schema)


def ansible_option(f: Field) -> dict[str, Any]:
    """The nodeprep_driver option of a driver field (an argument spec entry)."""
    schema, default = _schema(f), default_of(f, unset=True)
    kind = schema.get("type")
    spec: dict[str, Any]
    if kind == "boolean":
        spec = {"type": "bool"}
    elif kind == "integer":
        spec = {"type": "int"}
    elif kind == "array":
        spec = {"type": "list", "elements": "str"}
        if f.key != "modules" and "enum" in schema.get("items", {}):  # modules: the library checks them
            spec["choices"] = list(schema["items"]["enum"])
    else:
        spec = {"type": "path" if f.file else "str"}
        if "enum" in schema:
            spec["choices"] = list(schema["enum"])
    if default is not None and default is not NO_DEFAULT:
        spec["default"] = default
    return spec


def _py(value: Any) -> str:
    """A Python literal of a JSON-able value."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_py(v) for v in value) + "]"
    return json.dumps(value)


def module_options() -> list[str]:
    """module_utils/nodeprep_op_driver.py's DRIVER_OPTIONS (a line each, or a line per key)."""
    lines = ["DRIVER_OPTIONS = {"]
    for f in installed():
        items = [f"{json.dumps(k)}: {_py(v)}" for k, v in ansible_option(f).items()]
        line = f"    {json.dumps(f.key)}: {{{', '.join(items)}}},"
        if len(line) <= 110:
            lines.append(line)
        else:
            lines += [f"    {json.dumps(f.key)}: {{", *(f"        {i}," for i in items), "    },"]
    return [*lines, "}"]


def _yaml_entry(name: str, description: str, spec: dict[str, Any], indent: str) -> list[str]:
    lines = [f"{indent}{name}:", f"{indent}  description: >-"]  # a block: the text is never YAML
    lines += textwrap.wrap(description, 96, initial_indent=f"{indent}    ", subsequent_indent=f"{indent}    ")
    for key in ("type", "elements", "choices", "default"):
        if key in spec:
            lines.append(f"{indent}  {key}: {_flow(spec[key])}")
    return lines


def module_documentation() -> list[str]:
    """plugins/modules/nodeprep_driver.py's DOCUMENTATION options of the driver fields."""
    lines: list[str] = []
    for f in installed():
        lines += _yaml_entry(f.key, f"{f.help} (the profile's C({f.path})).", ansible_option(f), "  ")
    return lines


def _role_default(f: Field) -> Any:
    default = default_of(f, unset=True)
    return "" if default is None or default is NO_DEFAULT else default


def role_defaults() -> list[str]:
    """roles/nvidia_driver/defaults/main.yml's driver variables ("" for none)."""
    lines: list[str] = []
    for f in installed():
        lines += [*_comment(f"{f.help} (the profile's {f.path}).", ""),
                  f"nvidia_driver_{f.key}: {_flow(_role_default(f))}"]
    return lines


def _role_spec(f: Field) -> dict[str, Any]:
    spec = ansible_option(f)
    if spec["type"] == "path":  # "" is none: a role variable is a string
        spec["type"] = "str"
    if spec["type"] == "str" and "choices" in spec and _role_default(f) == "":
        spec["choices"] = ["", *spec["choices"]]
    spec["default"] = _role_default(f)
    return spec


def role_argument_specs() -> list[str]:
    """roles/nvidia_driver/meta/argument_specs.yml's driver variables."""
    lines: list[str] = []
    for f in installed():
        lines += _yaml_entry(f"nvidia_driver_{f.key}", f"{f.help} (the profile's {f.path}).",
                             _role_spec(f), "      ")
    return lines


def role_task(pinned: dict[str, str] | None = None) -> list[str]:
    """roles/nvidia_driver/tasks/install.yml: the module's driver options from the role's variables
    ("" or none: left out, the module's default); `pinned` replaces a field's value expression."""
    lines: list[str] = []
    for f in installed():
        var, kind = f"nvidia_driver_{f.key}", _role_spec(f)["type"]
        value = {"bool": f"{var} | bool", "int": f"{var} | int", "list": var}.get(
            kind, f"{var} or omit" if _role_default(f) == "" else var)
        lines.append(f'    {f.key}: "{{{{ {(pinned or {}).get(f.key, value)} }}}}"')
    return lines


def role_handler() -> list[str]:
    """roles/nvidia_driver/handlers/main.yml, the handler that loads the modules: the install task's
    request with the version it chose pinned (a version published meanwhile is not taken; the
    flavour follows from the same settings, as node/branch.py picks it for a given version)."""
    return role_task({"version": "__nvidia_driver_install.version | default(nvidia_driver_version) or omit"})


# file -> (the comment that opens a marker line, the regions: generated lines by name)
REGIONS: dict[str, tuple[str, Callable[[], list[str]]]] = {
    "docs/profile.md": ("<!--", docs_table),
    "examples/node.yaml": ("#", example_driver),
    f"{COLLECTION}/module_utils/nodeprep_op_driver.py": ("#", module_options),
    f"{COLLECTION}/modules/nodeprep_driver.py": ("#", module_documentation),
    f"{ROLE}/defaults/main.yml": ("#", role_defaults),
    f"{ROLE}/meta/argument_specs.yml": ("#", role_argument_specs),
    f"{ROLE}/tasks/install.yml": ("#", role_task),
    f"{ROLE}/handlers/main.yml": ("#", role_handler),
}


def _marker(opener: str, text: str, indent: str) -> str:
    return f"{indent}{opener} {text}{' -->' if opener == '<!--' else ''}"


def rewrite(text: str, opener: str, lines: list[str], name: str) -> str:
    """`text` with the lines between its BEGIN and END markers replaced by `lines`."""
    out = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(out) if BEGIN in line]
    ends = [i for i, line in enumerate(out) if line.strip().startswith(f"{opener} {END}")]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise SystemExit(f"{name}: expected one `{BEGIN}` ... `{END}` pair of marker lines")
    return "".join(out[:starts[0] + 1] + [line + "\n" for line in lines] + out[ends[0]:])


def derived() -> dict[Path, str]:
    """Every derived file's path and the text it should hold."""
    files = {SCHEMA_PATH: render_schema()}
    for name, (opener, render) in REGIONS.items():
        path = REPO / name
        files[path] = rewrite(path.read_text(), opener, render(), name)
    return files


def stale() -> list[Path]:
    return [path for path, text in derived().items() if path.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nodeprep.profile.generate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="rewrite the stale files")
    parser.add_argument("--check", action="store_true", help="exit 1 when a file is stale")
    args = parser.parse_args(argv)
    files = derived()
    old = [path for path, text in files.items() if path.read_text() != text]
    for path in old:
        if args.write:
            atomic_write(path, files[path])
        print(f"{'rewrote' if args.write else 'stale'}: {path.relative_to(REPO)}")
    return 1 if old and not args.write else 0


if __name__ == "__main__":
    sys.exit(main())
