"""nvidia-container-runtime's config.toml: the `nvidia` runtime in CDI mode, from nodeprep's spec.

- Written when the profile registers the `nvidia` runtime and enables CDI (`nodeprep runtime`, join,
  bootstrap): `[nvidia-container-runtime] mode = "cdi"`, `modes.cdi.default-kind = "nvidia.com/gpu"`
  (the spec's kind) and `modes.cdi.spec-dirs` = `runtime.cdi_spec_dirs`. The runtime then turns
  `NVIDIA_VISIBLE_DEVICES` and `cdi.k8s.io/*` annotations into devices of nodeprep's spec and runs runc.
- Every other setting of an existing file is kept (parsed and rendered again: its comments are not);
  a file that is not TOML is refused, naming it, and left as it is.
- Rendering is a pure function of the file and the profile: a second run changes nothing.
"""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

from ..errors import InputError
from ..profile import Runtime
from .cdi import KIND
from .files import FileChange, under

CONFIG = "/etc/nvidia-container-runtime/config.toml"
TABLE = "nvidia-container-runtime"
MAX_BYTES = 1 << 20
HEADER = (
    "# nvidia-container-runtime in CDI mode, set by nodeprep (nodeprep runtime / join): mode, default-kind\n"
    "# and spec-dirs are rewritten on the next run; other settings are kept.\n"
)


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return {}
    if len(raw) > MAX_BYTES:
        raise InputError(f"{CONFIG}: larger than {MAX_BYTES} bytes; fix or remove it first")
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise InputError(f"{CONFIG}: not valid TOML ({e}); fix or remove it first") from None


def _table(data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = data.setdefault(key, {})
    if not isinstance(value, dict):
        raise InputError(f"{CONFIG}: {where} is not a table; fix or remove it first")
    return value


def render_config(current: dict[str, Any], runtime: Runtime) -> bytes:
    """The config's bytes: `current` with CDI mode, nodeprep's kind and the profile's spec dirs."""
    data = copy.deepcopy(current)
    ncr = _table(data, TABLE, f"[{TABLE}]")
    ncr["mode"] = "cdi"
    cdi = _table(_table(ncr, "modes", f"[{TABLE}.modes]"), "cdi", f"[{TABLE}.modes.cdi]")
    cdi["default-kind"] = KIND
    cdi["spec-dirs"] = list(runtime.cdi_spec_dirs)
    return (HEADER + "\n" + tomli_w.dumps(data)).encode()


def plan_ctk_config(root: Path, runtime: Runtime) -> list[FileChange]:
    """The config change; [] unless the profile asks for both the nvidia runtime and CDI."""
    if not (runtime.nvidia_runtime and runtime.cdi):
        return []
    path = under(root, CONFIG)
    mode = (path.stat().st_mode & 0o7777) if path.exists() else 0o644
    return [FileChange(path, CONFIG, render_config(_read(path), runtime), mode)]
