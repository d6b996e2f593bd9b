"""Which container hooks on the node would run with a container's environment (`doctor`'s `hooks`).

A runtime starts a createContainer or startContainer hook from the container's own init, before
pivot_root, as root: a hook entry without an `env` of its own gets the container's environment, so
an image's LD_PRELOAD runs inside the hook's binary on the node (NVIDIA's CVE-2025-23266, fixed in
its toolkit by an explicit environment on every hook it writes). The other stages are started by the
runtime itself, with its own environment. Read here, beneath the root and as data only:

- CDI specs in /etc/cdi and /var/run/cdi (nodeprep's, NVIDIA's `nvidia-ctk cdi generate`, a DRA
  claim's, any other tool's): the `hooks` of the spec's and each device's containerEdits;
- OCI hooks.d files of podman and CRI-O (/usr/share/containers/oci/hooks.d, /etc/containers/oci/hooks.d);
- the base runtime specs containerd's handlers name (nodeprep's carries the CUDA gate).

A file that cannot be read or parsed is named as such; nothing here changes the node.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..yamlinput import load_yaml, read_input_bytes
from .containerd import config_files
from .files import under

CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
HOOKS_DIRS = ("/usr/share/containers/oci/hooks.d", "/etc/containers/oci/hooks.d")
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
IN_CONTAINER = ("createContainer", "startContainer")  # started from the container's init
MAX_FILE = 4 << 20


def _files(root: Path, folder: str, suffixes: tuple[str, ...]) -> Iterator[str]:
    """Node paths of the files in `folder` (beneath `root`) with one of `suffixes`, sorted."""
    try:
        here = under(root, folder)
        names = sorted(p.name for p in here.iterdir()) if here.is_dir() else []
    except (OSError, InputError):
        return
    for name in names:
        if name.endswith(suffixes):
            yield f"{folder}/{name}"


def _load(root: Path, target: str, *, as_yaml: bool) -> Any:
    """The document at `target` (a regular file beneath `root`, bounded; YAML with the limits of
    nodeprep.yamlinput), or a str saying why not."""
    try:
        path = under(root, target)
        if as_yaml:
            _, doc = load_yaml(path, limit=MAX_FILE, source=target)
            return doc.data
        return json.loads(read_input_bytes(path, limit=MAX_FILE, source=target))
    except InputError as e:
        return f"not read: {e.message}"
    except ValueError as e:
        return f"{target}: not read ({e})"


def _unsealed(hook: Any) -> bool:
    env = hook.get("env") if isinstance(hook, dict) else None
    return not (isinstance(env, list) and env)


def _name(hook: Any) -> str:
    return str(hook.get("path", "?")) if isinstance(hook, dict) else "?"


def cdi_problems(target: str, spec: Any) -> list[str]:
    """The hooks of one CDI spec that would inherit a container's environment (pure)."""
    if not isinstance(spec, dict):
        return []
    edits = [spec.get("containerEdits")]
    edits += [d.get("containerEdits") for d in spec.get("devices") or [] if isinstance(d, dict)]
    out = []
    for e in edits:
        for h in (e.get("hooks") or []) if isinstance(e, dict) else []:
            if isinstance(h, dict) and h.get("hookName") in IN_CONTAINER and _unsealed(h):
                out.append(f"{target}: {h['hookName']} hook {_name(h)} has no env")
    return sorted(set(out))


def hooks_d_problems(target: str, doc: Any) -> list[str]:
    """The hooks.d entry, when it runs in the container and has no env (pure)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("hook"), dict):
        return []
    stages: list[Any] = doc["stages"] if isinstance(doc.get("stages"), list) else []
    if any(s in IN_CONTAINER for s in stages) and _unsealed(doc["hook"]):
        return [f"{target}: {', '.join(s for s in stages if s in IN_CONTAINER)} hook {_name(doc['hook'])} "
                "has no env"]
    return []


def oci_spec_problems(target: str, spec: Any) -> list[str]:
    """The hooks of an OCI runtime spec (a base spec) that would inherit the container's env (pure)."""
    hooks = spec.get("hooks") if isinstance(spec, dict) else None
    out = []
    for stage in IN_CONTAINER:
        for h in (hooks.get(stage) or []) if isinstance(hooks, dict) else []:
            if _unsealed(h):
                out.append(f"{target}: {stage} hook {_name(h)} has no env")
    return out


def base_specs(root: Path) -> list[str]:
    """The base runtime specs containerd's handlers name in its config or any file it imports (each
    file on its own: whichever wins the merge, a file named anywhere is looked at); none when the node
    has no containerd config, or it cannot be read."""
    if not under(root, CONTAINERD_CONFIG).is_file():
        return []
    try:
        files = config_files(root, CONTAINERD_CONFIG)
    except (InputError, OSError):
        return []
    out: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            spec = node.get("base_runtime_spec")
            if isinstance(spec, str) and spec.startswith("/"):
                out.add(spec)
            for v in node.values():
                walk(v)

    for _, config in files:
        walk(config.get("plugins"))
    return sorted(out)


def inheriting_hooks(root: Path) -> list[str]:
    """One line per hook on the node under `root` that a runtime would start with a container's
    environment, or per file that could not be read."""
    out: list[str] = []
    for folder in CDI_DIRS:
        for target in _files(root, folder, (".json", ".yaml", ".yml")):
            doc = _load(root, target, as_yaml=True)
            out += [doc] if isinstance(doc, str) else cdi_problems(target, doc)
    for folder in HOOKS_DIRS:
        for target in _files(root, folder, (".json",)):
            doc = _load(root, target, as_yaml=False)
            out += [doc] if isinstance(doc, str) else hooks_d_problems(target, doc)
    for target in base_specs(root):
        doc = _load(root, target, as_yaml=False)
        out += [doc] if isinstance(doc, str) else oci_spec_problems(target, doc)
    return out
