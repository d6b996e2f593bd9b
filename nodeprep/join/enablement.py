"""What join's `systemctl enable kubelet.service` made, so that uninstall takes back only that.

Before a kubelet-mode join enables the unit, it records the unit's enablement links as they were
(`/var/lib/nodeprep/kubelet-enable.json`, beside the node's state: each `*.wants`, `*.requires` or
`*.upholds` link of that name in /etc/systemd/system with its target). The record is written once,
by the first join that enables the unit, so a later join does not take join's own links for the
node's. Uninstall removes the links there now that the record does not name (the ones the enable
made; none when kubelet was enabled before) and the record; a node where kubelet was enabled
before keeps it enabled. A live node's kubelet is stopped first when active (its join files go:
nodeprep.join.removal's `stop`), and not disabled unless the join enabled it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import InputError
from ..node.callbacks import Undo
from ..node.layout import Layout
from ..runtime.files import FileChange, under
from ..sysfs import read_bytes

UNIT = "kubelet.service"
RECORD_NAME = "kubelet-enable.json"
UNITS_DIR = "/etc/systemd/system"
_LINK_DIRS = (".wants", ".requires", ".upholds")


def record_target(root: Path) -> tuple[Path, str]:
    """The record's path on this host and as the node sees it."""
    layout = Layout(Path(root))
    path = layout.state_dir / RECORD_NAME
    return path, layout.node_path(path)


def unit_links(root: Path, unit: str = UNIT) -> dict[str, str]:
    """The enablement links of `unit` under `root` now: node path -> link text."""
    try:
        base = under(Path(root), UNITS_DIR)
    except InputError:
        return {}
    if not base.is_dir():
        return {}
    out: dict[str, str] = {}
    for d in sorted(base.iterdir()):
        if d.is_symlink() or not d.is_dir() or not d.name.endswith(_LINK_DIRS):
            continue
        link = d / unit
        if link.is_symlink():
            out[f"{UNITS_DIR}/{d.name}/{unit}"] = os.readlink(link)
    return out


def record_change(root: Path) -> FileChange | None:
    """The record to write before join enables the unit; None when one is there (the first stands)."""
    path, target = record_target(root)
    if path.is_symlink() or path.exists():
        return None
    content = json.dumps({"format": 1, "unit": UNIT, "links_before": unit_links(root)},
                         indent=2, sort_keys=True) + "\n"
    return FileChange(path, target, content.encode(), 0o644)


def _recorded(path: Path) -> dict[str, str] | None:
    """The links the record names; None when it is not a record join wrote (then nothing is undone)."""
    try:
        data = json.loads(read_bytes(path))
    except (OSError, ValueError):  # a link, not a regular file, over 64 KiB, not JSON
        return None
    links = data.get("links_before") if isinstance(data, dict) else None
    if (data.get("format") != 1 or data.get("unit") != UNIT or not isinstance(links, dict)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in links.items())):
        return None
    return links


def plan_undo(root: Path) -> tuple[list[Undo], list[str]]:
    """What uninstall undoes of join's enable: the links made since the record, then the record
    (undo), and one line for a record that is not join's (kept)."""
    path, target = record_target(root)
    if not (path.is_symlink() or path.exists()):
        return [], []
    before = _recorded(path)
    if before is None:
        return [], [f"{target}: not a record nodeprep join wrote; left in place"]
    undo = [Undo(link, under(Path(root), link, follow_last=False))
            for link in sorted(set(unit_links(root)) - set(before))]
    return [*undo, Undo(target, path)], []
