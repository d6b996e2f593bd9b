"""Build matrices: drivers x kernels x flavours for one OS, from a small YAML file.

    os: debian-12                  # a target OS of nodeprep.targets (default debian-12)
    drivers: [535.309.01, "535"]   # exact versions, branches, or "latest"
    kernels: [6.1.0-56-amd64, latest]
    flavours: [proprietary, open]  # default [proprietary]
    exclude:                       # optional: drop cells matching every given key
      - {driver: "535", flavour: open}

`expand` gives one cell per combination (a CI system runs one `nodeprep build-driver` per cell);
`nodeprep build-matrix FILE --build -j N` builds them here.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from .. import targets
from ..errors import ProfileError
from ..sources.drivers import DRIVER_RE, FLAVOURS

KEYS = {"os", "drivers", "kernels", "flavours", "exclude"}
LATEST = ("latest", "default", None)


@dataclass(frozen=True)
class Cell:
    os: str
    driver: str | None  # None: newest served
    flavour: str
    kernel: str | None  # None: the OS's default kernel

    def args(self) -> list[str]:
        out = ["--os", self.os, "--flavour", self.flavour]
        if self.driver:
            out += ["--driver", self.driver]
        if self.kernel:
            out += ["--kernel", self.kernel]
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"args": self.args()}


def _list(data: dict[str, Any], key: str, default: list[Any], problems: list[str]) -> list[Any]:
    value = data.get(key, default)
    if isinstance(value, (str, int, float)):
        value = [value]
    if not isinstance(value, list) or not value:
        problems.append(f"{key}: must be a non-empty list")
        return []
    return [None if v in LATEST else str(v) for v in value]


def parse(text: str, *, source: str = "matrix") -> list[Cell]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ProfileError([f"not valid YAML ({str(e).splitlines()[0]})"], source=source) from None
    if not isinstance(data, dict):
        raise ProfileError(["must be a mapping with drivers, kernels, flavours"], source=source)
    problems = [f"{k}: unknown key (known: {', '.join(sorted(KEYS))})" for k in data if k not in KEYS]
    os_name = str(data.get("os", targets.DEFAULT))
    if os_name not in targets.names():
        problems.append(f"os: unknown OS {os_name!r} (known: {', '.join(targets.names())})")
    drivers = _list(data, "drivers", [None], problems)
    kernels = _list(data, "kernels", [None], problems)
    flavours = _list(data, "flavours", ["proprietary"], problems)
    for i, d in enumerate(drivers):
        if d is not None and not DRIVER_RE.match(d):
            problems.append(f"drivers[{i}]: {d!r} is not a driver version or branch (or 'latest')")
    for i, f in enumerate(flavours):
        if f not in FLAVOURS:
            problems.append(f"flavours[{i}]: {f!r} is not one of {', '.join(FLAVOURS)}")
    excludes = data.get("exclude", []) or []
    if not isinstance(excludes, list) or not all(isinstance(e, dict) for e in excludes):
        problems.append("exclude: must be a list of mappings like {driver: ..., kernel: ..., flavour: ...}")
        excludes = []
    for i, e in enumerate(excludes):
        for k in e:
            if k not in ("driver", "kernel", "flavour"):
                problems.append(f"exclude[{i}].{k}: unknown key (driver, kernel, flavour)")
    if problems:
        raise ProfileError(problems, source=source)
    cells = []
    for d, k, f in itertools.product(drivers, kernels, flavours):
        cell = Cell(os=os_name, driver=d, flavour=f or "proprietary", kernel=k)
        if any(all(str(getattr(cell, key) or "latest") == str(v) for key, v in e.items()) for e in excludes):
            continue
        if cell not in cells:
            cells.append(cell)
    return cells


def load(path: Path) -> list[Cell]:
    try:
        text = path.read_text()
    except OSError as e:
        raise ProfileError([f"cannot read ({e.strerror})"], source=str(path)) from None
    return parse(text, source=str(path))
