"""containerd: register the `nvidia` runtime and enable CDI through a drop-in.

- The main config's `version` picks the CRI plugin key: 1 -> `cri`, 2 -> `io.containerd.grpc.v1.cri`,
  3 and later -> `io.containerd.cri.v1.runtime`. A missing or empty file counts as version 2 (works
  with containerd 1.x and is migrated by 2.x); a non-empty file without `version` is version 1
  (containerd's own rule; nvidia-ctk pkg/config/engine/containerd does the same).
- The main file only gains one `imports` entry (`<dir>/conf.d/*.toml`), edited as text so comments
  and layout stay; the edit is checked by parsing before and after.
- The drop-in `<dir>/conf.d/99-nodeprep-nvidia.toml` starts from a copy of the main file's whole CRI
  plugin table, because containerd before 2.1 replaces a plugin's table by key when merging imports
  instead of merging it (containerd#5837). It then adds runtimes.nvidia (options copied from runc,
  BinaryName = nvidia-container-runtime), enable_cdi/cdi_spec_dirs, and default_runtime_name only
  when asked.
- The CUDA gate (nodeprep.containerhooks.gate) runs for every container through the runtime handlers' base
  spec: `<dir>/nodeprep-base-spec.json` is containerd's own default spec (what `ctr oci spec` of the
  node's containerd prints, from nodeprep's data by the version the root's dpkg status names:
  runtime.ocidefault; nothing of the root is run; its shared `cgroupsPath` dropped) plus the gate as a
  createContainer hook, and every runc-type handler of the drop-in gets `base_runtime_spec` naming
  it (a handler that already has one keeps it, with a warning). Version not known: no base spec, a
  warning.
- Rendering is a pure function of the main file, the profile and that default spec: a second run
  changes nothing.
"""

from __future__ import annotations

import copy
import glob
import json
import logging
import os
import re
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

import tomli_w

from ..errors import InputError
from ..profile import Cluster, Runtime
from . import ocidefault
from .files import FileChange, under

log = logging.getLogger(__name__)

DROP_IN_NAME = "99-nodeprep-nvidia.toml"
BASE_SPEC_NAME = "nodeprep-base-spec.json"
RUNTIME_NAME = "nvidia"
CRI_KEYS = {1: "cri", 2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
DEFAULT_RUNTIME_TYPE = "io.containerd.runc.v2"
HEADER = (
    "# Written by nodeprep (nodeprep join / container_runtime role). Do not edit: it is rendered\n"
    "# from {main} and the node profile, and rewritten on the next run.\n"
    "# It repeats the main file's whole CRI plugin table: containerd < 2.1 replaces plugin tables\n"
    "# from imports instead of merging them.\n"
)


def config_version(data: dict[str, Any], text: str) -> int:
    """containerd's config version: explicit `version`, else 2 for an empty file, else 1."""
    if "version" in data:
        v = data["version"]
        if not isinstance(v, int) or v < 1:
            raise InputError(f"containerd config: version = {v!r} is not a positive integer")
        return v
    return 2 if not text.strip() else 1


def cri_key(version: int) -> str:
    return CRI_KEYS[min(version, 3)]


def drop_in_dir(main_target: str) -> str:
    return str(PurePosixPath(main_target).parent / "conf.d")


def import_entry(main_target: str) -> str:
    return f"{drop_in_dir(main_target)}/*.toml"


def _read(path: Path, shown_as: str) -> tuple[str, dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return "", {}
    try:
        return text, tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"{shown_as}: not valid TOML ({e}); fix or remove it first") from None


# ---------------------------------------------------------------------------------------------
# The imports line (minimal text edit)


def _first_table(text: str) -> int:
    m = re.search(r"(?m)^[ \t]*\[", text)
    return m.start() if m else len(text)


def _array_end(text: str, start: int) -> int:
    """Index just past the `]` closing the array that opens at text[start] == '['."""
    depth, i, quote = 0, start, ""
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\" and quote == '"':
                i += 2
                continue
            if text.startswith(quote, i):
                i += len(quote)
                quote = ""
                continue
        elif ch in "\"'":
            quote = text[i : i + 3] if text[i : i + 3] in ('"""', "'''") else ch
            i += len(quote)
            continue
        elif ch == "#":
            nl = text.find("\n", i)
            i = len(text) if nl < 0 else nl
            continue
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise InputError("containerd config: unterminated imports array")


def with_import(text: str, entry: str) -> str:
    """`text` with `entry` appended to the top-level `imports` (added if absent); everything else
    byte-for-byte unchanged. Raises if the result would parse differently in any other key."""
    data = tomllib.loads(text) if text.strip() else {}
    imports = data.get("imports", [])
    if not isinstance(imports, list):
        raise InputError("containerd config: imports is not a list")
    if entry in imports:
        return text
    line = "imports = [" + ", ".join(json.dumps(x, ensure_ascii=False) for x in [*imports, entry]) + "]"
    if "imports" in data:
        m = re.search(r"(?m)^[ \t]*imports[ \t]*=[ \t]*\[", text[: _first_table(text)])
        if not m:
            raise InputError("containerd config: cannot locate the top-level imports line to edit")
        end = _array_end(text, m.end() - 1)
        new = text[: m.start()] + line + text[end:]
    elif not text.strip():
        new = "version = 2\n" + line + "\n"
    else:
        pos = _first_table(text)
        before = text[:pos]
        if before and not before.endswith("\n"):
            before += "\n"
        new = before + line + "\n" + ("\n" if pos < len(text) and before.strip() else "") + text[pos:]
    want = {**data, "imports": [*imports, entry]}
    if not text.strip():
        want.setdefault("version", 2)
    if tomllib.loads(new) != want:  # pragma: no cover - guards the text surgery
        raise InputError(
            "containerd config: adding the imports entry would change other settings; add it by hand: " + line
        )
    return new


# ---------------------------------------------------------------------------------------------
# The drop-in


def _runc_template(cri: dict[str, Any]) -> dict[str, Any]:
    """The runtime table to copy: runc, else the default runtime when runc-based, else defaults."""
    runtimes = cri.get("containerd", {}).get("runtimes", {})
    default_name = cri.get("containerd", {}).get("default_runtime_name")
    for name in ("runc", default_name):
        rt = runtimes.get(name) if name else None
        if isinstance(rt, dict) and rt.get("runtime_type", DEFAULT_RUNTIME_TYPE) == DEFAULT_RUNTIME_TYPE:
            return copy.deepcopy(rt)
    return {"runtime_type": DEFAULT_RUNTIME_TYPE}


def base_spec_target(main_target: str) -> str:
    return f"{PurePosixPath(main_target).parent}/{BASE_SPEC_NAME}"


def default_spec(root: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(containerd's default OCI spec, None) for the node's containerd version, from nodeprep's data
    (runtime.ocidefault: the version read as data, the node's `ctr` never run), or (None, why not)."""
    version, where = ocidefault.node_version(root)
    if version is None:
        return None, f"containerd's version is not known: {where}; the root's ctr is never run"
    parsed = ocidefault.parse_version(version)
    spec = ocidefault.spec_for(parsed) if parsed else None
    if spec is None:
        return None, (f"containerd {version} ({where}): its default spec is not known to nodeprep "
                      f"(known: {ocidefault.known_releases()})")
    return spec, None


def render_base_spec(default: dict[str, Any], hook: dict[str, Any]) -> bytes:
    """The handlers' base spec: containerd's default plus `hook` as a createContainer hook (pure).
    The default's cgroupsPath (`/default`, one cgroup for every container) is dropped: the CRI
    plugin sets each container's own."""
    spec = copy.deepcopy(default)
    spec["linux"].pop("cgroupsPath", None)
    hooks: dict[str, Any] = spec["hooks"] if isinstance(spec.get("hooks"), dict) else {}
    theirs = [h for h in hooks.get("createContainer") or []  # an earlier nodeprep's is replaced
              if not (isinstance(h, dict) and h.get("path") == hook.get("path"))]
    spec["hooks"] = {**hooks, "createContainer": [*theirs, hook]}
    return (json.dumps(spec, indent=2, sort_keys=True) + "\n").encode()


def _with_base_spec(runtimes: dict[str, Any], target: str, warnings: list[str]) -> None:
    """`base_runtime_spec = target` on every runc-type handler without a base spec of its own."""
    for name, rt in sorted(runtimes.items()):
        if not isinstance(rt, dict) or rt.get("runtime_type", DEFAULT_RUNTIME_TYPE) != DEFAULT_RUNTIME_TYPE:
            continue
        own = rt.get("base_runtime_spec")
        if own and own != target:
            warnings.append(f"containerd runtime {name!r} keeps its base_runtime_spec {own}: the CUDA gate "
                            "does not run for its containers")
            continue
        rt["base_runtime_spec"] = target


def render_drop_in(
    main: dict[str, Any],
    version: int,
    runtime: Runtime,
    cluster: Cluster | None,
    main_target: str,
    warnings: list[str] | None = None,
    base_spec: str | None = None,
) -> bytes:
    """The drop-in's bytes: pure function of the parsed main config and the profile."""
    warnings = warnings if warnings is not None else []
    key = cri_key(version)
    cri = copy.deepcopy(main.get("plugins", {}).get(key, {}))
    if not isinstance(cri, dict):
        raise InputError(f"containerd config: plugins.{key!r} is not a table")
    ctd = cri.setdefault("containerd", {})
    runtimes = ctd.setdefault("runtimes", {})
    if cluster is not None:
        want = cluster.cgroup_driver == "systemd"
        runc = runtimes.get("runc")
        if isinstance(runc, dict) and runc.get("options", {}).get("SystemdCgroup", False) != want:
            runc.setdefault("options", {})["SystemdCgroup"] = want
            warnings.append(
                f"containerd runc SystemdCgroup set to {str(want).lower()} to match "
                f"cluster.cgroup_driver {cluster.cgroup_driver}"
            )
    if runtime.nvidia_runtime:
        nvidia = _runc_template(cri)
        nvidia.setdefault("options", {})["BinaryName"] = runtime.nvidia_runtime_path
        nvidia["runtime_type"] = DEFAULT_RUNTIME_TYPE
        runtimes[RUNTIME_NAME] = nvidia
        if runtime.default_runtime:
            ctd["default_runtime_name"] = RUNTIME_NAME
    if runtime.cdi:
        cri["enable_cdi"] = True
        cri["cdi_spec_dirs"] = list(runtime.cdi_spec_dirs)
    if base_spec:
        runtimes.setdefault("runc", _runc_template(cri))
        _with_base_spec(runtimes, base_spec, warnings)
    doc: dict[str, Any] = {"version": version, "plugins": {key: cri}}
    return (HEADER.format(main=main_target) + "\n" + tomli_w.dumps(doc)).encode()


def plan_containerd(
    root: Path, runtime: Runtime, cluster: Cluster | None = None, warnings: list[str] | None = None,
    gate_hook: dict[str, Any] | None = None,
) -> list[FileChange]:
    """File changes for containerd (main config imports line + drop-in, + with `gate_hook` the
    handlers' base spec carrying it); [] when the profile asks for neither the nvidia runtime nor
    CDI."""
    if not (runtime.nvidia_runtime or runtime.cdi):
        return []
    main_target = runtime.containerd_config
    main_path = under(root, main_target)
    text, data = _read(main_path, main_target)
    version = config_version(data, text)
    if version == 1:
        (warnings if warnings is not None else []).append(
            f"{main_target} has no `version` line: containerd reads it as a version 1 config "
            "(plugin key `cri`); consider `containerd config migrate`"
        )
    mode = (main_path.stat().st_mode & 0o7777) if main_path.exists() else 0o644
    new_main = with_import(text, import_entry(main_target))
    drop_target = f"{drop_in_dir(main_target)}/{DROP_IN_NAME}"
    base: list[FileChange] = []
    if gate_hook is not None:
        default, why = default_spec(root)
        if default is None:
            (warnings if warnings is not None else []).append(
                f"containerd base spec not written ({why}): the CUDA gate does not run for containerd's "
                "containers")
        else:
            target = base_spec_target(main_target)
            base = [FileChange(under(root, target), target, render_base_spec(default, gate_hook), 0o644)]
    drop_in = render_drop_in(data, version, runtime, cluster, main_target, warnings,
                             base[0].target if base else None)
    return [
        FileChange(main_path, main_target, new_main.encode(), mode),
        *base,
        FileChange(under(root, drop_target), drop_target, drop_in, 0o644),
    ]


# ---------------------------------------------------------------------------------------------
# Reading back (what containerd will see)


def _merge_plugins(into: dict[str, Any], new: dict[str, Any]) -> None:
    """containerd < 2.1 import semantics: top-level keys override, `imports` append, each plugin
    table is replaced as a whole."""
    for k, v in new.items():
        if k == "plugins" and isinstance(v, dict):
            into.setdefault("plugins", {}).update(v)
        elif k == "imports":
            into.setdefault("imports", []).extend(x for x in v if x not in into.get("imports", []))
        else:
            into[k] = v


def config_files(root: Path, main_target: str) -> list[tuple[str, dict[str, Any]]]:
    """(node path, data) of the main config and each file its imports match, in containerd's order
    (paths resolved under `root`). Each file a glob matches is resolved beneath `root` again by its
    node path, so a matched link reads the image's file, not the host's."""
    _, main = _read(under(root, main_target), main_target)
    out = [(main_target, main)]
    seen = {os.path.normpath(main_target)}
    for entry in list(main.get("imports", [])):
        pattern = entry if entry.startswith("/") else str(PurePosixPath(main_target).parent / entry)
        for host in sorted(glob.glob(str(under(root, pattern)))):
            target = "/" + str(Path(host).relative_to(root))
            if os.path.normpath(target) in seen:
                continue
            seen.add(os.path.normpath(target))
            out.append((target, _read(under(root, target), target)[1]))
    return out


def merged_config(root: Path, main_target: str) -> dict[str, Any]:
    """The main config with its imports merged in (`config_files`), as containerd 1.x and 2.0 merge
    them. Used by doctor-style checks and tests."""
    files = config_files(root, main_target)
    merged = copy.deepcopy(files[0][1])
    for _, data in files[1:]:
        _merge_plugins(merged, data)
    return merged


def nvidia_runtime_of(config: dict[str, Any]) -> dict[str, Any] | None:
    version = config.get("version", 1)
    cri = config.get("plugins", {}).get(cri_key(version), {})
    runtime: dict[str, Any] | None = cri.get("containerd", {}).get("runtimes", {}).get(RUNTIME_NAME)
    return runtime


def missing_runtime_warning(root: Path, binary: str) -> str | None:
    """One line when the `nvidia` runtime's BinaryName is not installed on the node at `root`."""
    try:
        present = under(root, binary).exists()
    except Exception:  # noqa: BLE001 - a link out of --root: cannot tell, say nothing
        return None
    if present:
        return None
    return (
        f"nvidia-container-runtime is not installed ({binary}): the containerd runtime `nvidia` "
        "(RuntimeClass nvidia) cannot start containers; CDI devices (nvidia.com/gpu=...) work without it"
    )


def drop_in_runtime_warning(root: Path, main_target: str = "/etc/containerd/config.toml") -> str | None:
    """missing_runtime_warning for the BinaryName nodeprep's drop-in registered, if it did."""
    target = f"{drop_in_dir(main_target)}/{DROP_IN_NAME}"
    try:
        _, data = _read(under(root, target), target)
    except Exception:  # noqa: BLE001 - activation must not fail over a report line
        return None
    for table in data.get("plugins", {}).values():
        if not isinstance(table, dict):
            continue
        runtime = table.get("containerd", {}).get("runtimes", {}).get(RUNTIME_NAME)
        binary = (runtime or {}).get("options", {}).get("BinaryName")
        if isinstance(binary, str) and binary.startswith("/"):
            return missing_runtime_warning(root, binary)
    return None
