"""The MIG layout of a node profile in NVIDIA mig-parted's format (`version: v1`, `mig-configs`), read
as hostile input: every key and value checked the way mig-parted's api/spec/v1 reads it, and stricter
where nodeprep uses a value (a config name becomes the `nvidia.com/mig.config` label value; sizes are
bounded). Pure: data in, (plain data, problems) out; `MigEntry` is the typed view the planner uses."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .rules import Problem, Problems, Rule, name_of, show, type_name

VERSION = "v1"
MAX_CONFIGS = 64
MAX_ENTRIES = 64
MAX_DEVICES = 64  # GPU indexes per entry (a node has at most a few dozen GPUs)
MAX_COUNT = 64  # instances of one profile on one GPU (NVML allows at most 8 GPU instances)
# A config name is a label value (nvidia.com/mig.config), as mig-manager reads it.
NAME_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
# go-nvlib's MIG profile strings: [<C>c.]<G>g.<GB>gb, then +attrs or -attrs (me, me.all, gfx, ...).
PROFILE_RE = re.compile(r"^(?:(?P<c>[1-9]\d?)c\.)?(?P<g>[1-9]\d?)g\.(?P<gb>[1-9]\d{0,3})gb"
                        r"(?:(?P<sign>[+-])(?P<attrs>[A-Za-z][A-Za-z0-9]*(?:\.[A-Za-z0-9]+)*"
                        r"(?:,[A-Za-z][A-Za-z0-9]*(?:\.[A-Za-z0-9]+)*)*))?$")
PCI_ID_RE = re.compile(r"^0x[0-9A-Fa-f]{8}$")  # mig-parted's device-filter: 0x<device><vendor>, 0x233010DE
ENTRY_KEYS = ("device-filter", "devices", "mig-enabled", "mig-devices")


@dataclass(frozen=True)
class MigEntry:
    """One entry of a mig-config: which GPUs, MIG on or off, and the MIG devices each gets."""

    devices: tuple[int, ...] | None  # None: all
    device_filter: tuple[str, ...]  # PCI ids (upper-case hex after 0x); empty: any GPU
    mig_enabled: bool
    mig_devices: tuple[tuple[str, int], ...]  # (profile, count), counts > 0, in the order given


def profile_problem(text: Any) -> str | None:
    """Why `text` is not a MIG profile string as go-nvlib parses it, or None."""
    if not isinstance(text, str):
        return f"MIG profile {show(text)} must be a string"
    m = PROFILE_RE.fullmatch(text)
    if not m:
        return f"{show(text)} is not a MIG profile (e.g. 1g.10gb, 1c.2g.20gb, 1g.10gb+me)"
    attrs = (m.group("attrs") or "").split(",") if m.group("attrs") else []
    if len(set(attrs)) != len(attrs):
        return f"{show(text)}: an attribute is repeated"
    if m.group("c") and int(m.group("c")) > int(m.group("g")):
        return f"{show(text)}: more compute slices than GPU slices"
    return None


def _entry(where: str, raw: Any) -> Problems:
    if not isinstance(raw, dict):
        return [f"{where}: expected a mapping, got {type_name(raw)}"]
    problems: Problems = [f"{where}: unknown key {name_of(k)!s} (allowed: {', '.join(ENTRY_KEYS)})"
                          for k in raw if k not in ENTRY_KEYS]
    for key in ("devices", "mig-enabled"):
        if key not in raw:
            problems.append(f"{where}: {key} is required")
    devices = raw.get("devices")
    if "devices" in raw and devices != "all":
        if not isinstance(devices, list):
            problems.append(f"{where}.devices: expected 'all' or a list of GPU indexes, got {show(devices)}")
        elif not devices or len(devices) > MAX_DEVICES:
            problems.append(f"{where}.devices: between 1 and {MAX_DEVICES} GPU indexes")
        else:
            bad = [d for d in devices if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < 1024]
            if bad:
                problems.append(f"{where}.devices: {show(bad[0])} is not a GPU index (0, 1, ...)")
            elif len(set(devices)) != len(devices):
                problems.append(f"{where}.devices: a GPU index is repeated")
    if "device-filter" in raw:
        flt = raw["device-filter"]
        ids = [flt] if isinstance(flt, str) else flt
        if not isinstance(ids, list) or not ids or len(ids) > MAX_DEVICES:
            problems.append(f"{where}.device-filter: expected a PCI id or a list of them (0x233010DE)")
        else:
            bad = [i for i in ids if not isinstance(i, str) or not PCI_ID_RE.fullmatch(i)]
            if bad:
                problems.append(f"{where}.device-filter: {show(bad[0])} is not a PCI id (0x<device><vendor>, "
                                "e.g. 0x233010DE)")
    enabled = raw.get("mig-enabled")
    if "mig-enabled" in raw and not isinstance(enabled, bool):
        problems.append(f"{where}.mig-enabled: expected true or false, got {show(enabled)}")
    if "mig-devices" in raw:
        problems += _mig_devices(f"{where}.mig-devices", raw["mig-devices"])
    if enabled is True and raw.get("mig-devices") is None:
        problems.append(f"{where}.mig-devices: required when mig-enabled is true ({{}} for none)")
    if enabled is False and raw.get("mig-devices"):
        problems.append(f"{where}.mig-devices: MIG devices given while mig-enabled is false")
    return problems


def _mig_devices(where: str, raw: Any) -> Problems:
    if raw is None:
        return []
    if not isinstance(raw, dict):
        return [f"{where}: expected a mapping of MIG profile to count, got {type_name(raw)}"]
    if len(raw) > MAX_ENTRIES:
        return [f"{where}: at most {MAX_ENTRIES} profiles"]
    problems: Problems = []
    for profile, count in raw.items():
        why = profile_problem(profile)
        if why:
            problems.append(f"{where}: {why}")
        elif isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_COUNT:
            problems.append(f"{where}.{profile}: count {show(count)} is not a whole number "
                            f"from 0 to {MAX_COUNT}")
    if not problems and raw and not any(raw.values()):
        problems.append(f"{where}: every count is 0")
    return problems


def _at(text: str, *path: Any) -> Problem:
    p = Problem(text)
    p.at = path
    return p


def check_spec(value: Any) -> tuple[Any, Problems]:
    """mig-parted's Spec: `version: v1` and `mig-configs` (name -> non-empty list of entries)."""
    if value is None:
        return None, []
    if not isinstance(value, dict):
        return value, [f"expected a mig-parted document (version: v1, mig-configs), got {type_name(value)}"]
    problems: Problems = [f"unknown key {name_of(k)!s} (allowed: version, mig-configs)"
                          for k in value if k not in ("version", "mig-configs")]
    if value.get("version") != VERSION:
        problems.append(f"version: {show(value.get('version'))} is not {VERSION!r} (mig-parted's format)")
    configs = value.get("mig-configs")
    if not isinstance(configs, dict) or not configs:
        problems.append("mig-configs: required, a mapping of config name to a list of entries")
        return value, problems
    if len(configs) > MAX_CONFIGS:
        return value, [*problems, f"mig-configs: at most {MAX_CONFIGS} configs"]
    for name, entries in configs.items():
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            problems.append(_at(f"mig-configs: config name {show(name)} is not a label value "
                                "(letters, digits, '-', '_', '.'; at most 63)", "mig-configs"))
            continue
        where = f"mig-configs.{name}"
        if not isinstance(entries, list) or not entries or len(entries) > MAX_ENTRIES:
            problems.append(f"{where}: a list of 1 to {MAX_ENTRIES} entries")
            continue
        for i, entry in enumerate(entries):
            problems += [_at(p, "mig-configs", name, i) for p in _entry(f"{where}[{i}]", entry)]
    return value, problems


SCHEMA: dict[str, Any] = {
    "type": ["object", "null"],
    "required": ["version", "mig-configs"],
    "additionalProperties": False,
    "properties": {
        "version": {"const": VERSION},
        "mig-configs": {
            "type": "object",
            "minProperties": 1,
            "propertyNames": {"pattern": NAME_RE.pattern},
            "additionalProperties": {
                "type": "array", "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["devices", "mig-enabled"],
                    "additionalProperties": False,
                    "properties": {
                        "device-filter": {"anyOf": [
                            {"type": "string", "pattern": PCI_ID_RE.pattern},
                            {"type": "array", "minItems": 1,
                             "items": {"type": "string", "pattern": PCI_ID_RE.pattern}}]},
                        "devices": {"anyOf": [{"const": "all"},
                                              {"type": "array", "minItems": 1, "uniqueItems": True,
                                               "items": {"type": "integer", "minimum": 0}}]},
                        "mig-enabled": {"type": "boolean"},
                        "mig-devices": {"type": ["object", "null"],
                                        "propertyNames": {"pattern": PROFILE_RE.pattern},
                                        "additionalProperties": {"type": "integer", "minimum": 0,
                                                                 "maximum": MAX_COUNT}},
                    },
                },
            },
        },
    },
}

mig_parted = Rule(check_spec, SCHEMA)


def entries(spec: dict[str, Any], name: str) -> tuple[MigEntry, ...]:
    """The typed entries of config `name` of a spec `check_spec` accepted (KeyError: no such config)."""
    out = []
    for raw in spec["mig-configs"][name]:
        flt = raw.get("device-filter")
        ids = () if flt is None else (flt,) if isinstance(flt, str) else tuple(flt)
        devices = raw["devices"]
        out.append(MigEntry(
            devices=None if devices == "all" else tuple(devices),
            device_filter=tuple("0x" + i[2:].upper() for i in ids),
            mig_enabled=raw["mig-enabled"],
            mig_devices=tuple((p, c) for p, c in (raw.get("mig-devices") or {}).items() if c > 0),
        ))
    return tuple(out)
