"""The label settings of a node profile: `labels.extra`, `labels.cloud`, `cluster.node_name`.

Uses the profile loader (nodeprep.profile.load_profile) when present; until it lands, or if it is
absent, reads those three fields from the YAML directly with the same one-line errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import ProfileError
from .cloud import CLOUD_CHOICES
from .validate import validate_label


@dataclass(frozen=True)
class ProfileLabels:
    extra: dict[str, str] = field(default_factory=dict)
    cloud: str = "auto"
    node_name: str | None = None


def _from_loader(path: Path) -> ProfileLabels | None:
    try:
        from ..profile import load_profile  # type: ignore[attr-defined]
    except ImportError:
        return None
    p = load_profile(path)
    labels = getattr(p, "labels", None)
    cluster = getattr(p, "cluster", None)
    return ProfileLabels(
        extra=dict(getattr(labels, "extra", None) or {}),
        cloud=getattr(labels, "cloud", None) or "auto",
        node_name=getattr(cluster, "node_name", None) if cluster is not None else None,
    )


def _from_yaml(path: Path) -> ProfileLabels:
    src = str(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as e:
        raise ProfileError([f"cannot read ({e.strerror})"], source=src) from None
    except yaml.YAMLError as e:
        raise ProfileError([f"not valid YAML ({str(e).splitlines()[0]})"], source=src) from None
    if not isinstance(data, dict):
        raise ProfileError(["expected a mapping at the top level"], source=src)
    problems: list[str] = []
    labels: Any = data.get("labels") or {}
    if not isinstance(labels, dict):
        raise ProfileError(["labels: expected a mapping"], source=src)
    extra: Any = labels.get("extra") or {}
    if not isinstance(extra, dict):
        problems.append("labels.extra: expected a mapping of label keys to string values")
        extra = {}
    clean: dict[str, str] = {}
    for k, v in extra.items():
        if not isinstance(v, str):
            problems.append(f"labels.extra.{k}: value must be a string (quote it)")
            continue
        problems += [f"labels.extra.{k}: {p}" for p in validate_label(str(k), v)]
        clean[str(k)] = v
    cloud = labels.get("cloud", "auto")
    if cloud not in CLOUD_CHOICES:
        problems.append(f"labels.cloud: {cloud!r} is not one of {', '.join(CLOUD_CHOICES)}")
    cluster = data.get("cluster") or {}
    node_name = cluster.get("node_name") if isinstance(cluster, dict) else None
    if problems:
        raise ProfileError(problems, source=src)
    return ProfileLabels(clean, cloud, node_name if isinstance(node_name, str) else None)


def profile_labels(path: Path) -> ProfileLabels:
    loaded = _from_loader(path)
    return loaded if loaded is not None else _from_yaml(path)
