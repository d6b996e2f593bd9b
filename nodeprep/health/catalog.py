"""NVIDIA's Xid catalog as data: nodeprep/data/xid-catalog.json maps each Xid nodeprep handles to a
class (memory, bus, firmware, nvlink, application, recovery) and to the catalog's immediate-action
resolution bucket, which nodeprep reads as one of four actions: ignore, reset (the GPU), reboot (the
node), replace (the GPU). The file names its source; docs/node.md prints the table."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

PATH = Path(__file__).resolve().parents[1] / "data" / "xid-catalog.json"

# How bad each action is, least first: a GPU's action is the worst of its findings.
ACTIONS = ("ignore", "reset", "reboot", "replace")


@dataclass(frozen=True)
class XidClass:
    code: int
    mnemonic: str
    description: str
    klass: str
    bucket: str
    action: str


@dataclass(frozen=True)
class Catalog:
    source: str
    xids: dict[int, XidClass]
    unknown: XidClass

    def lookup(self, code: int) -> XidClass:
        """The catalog's row for `code`, or the unknown row (a reset) under this code."""
        row = self.xids.get(code)
        if row is not None:
            return row
        u = self.unknown
        return XidClass(code, "UNKNOWN", "an Xid the catalog table does not list", u.klass, u.bucket,
                        u.action)


def worst(actions: list[str]) -> str:
    return max(actions, key=ACTIONS.index, default="ignore")


@functools.cache
def catalog(path: Path = PATH) -> Catalog:
    """The catalog file, checked (a malformed row is a bug of the package: ValueError)."""
    data = json.loads(path.read_text())
    actions = data["actions"]
    if not set(actions.values()) <= set(ACTIONS):
        raise ValueError(f"{path}: an action outside {ACTIONS}")
    rows: dict[int, XidClass] = {}
    for row in data["xids"]:
        code = row["code"]
        if not isinstance(code, int) or code in rows or row["bucket"] not in actions:
            raise ValueError(f"{path}: bad row {row!r}")
        rows[code] = XidClass(code, row["mnemonic"], row["description"], row["class"], row["bucket"],
                              actions[row["bucket"]])
    u = data["unknown"]
    return Catalog(data["source"], rows, XidClass(0, "UNKNOWN", u["note"], u["class"], u["bucket"],
                                                  actions[u["bucket"]]))


# Xid 154's line names the recovery action the driver wants (NVML_GPU_RECOVERY_ACTION_*).
_RECOVERY = re.compile(r"to 0x([0-9a-fA-F]{1,2})\b")
RECOVERY_ACTIONS = {0: "ignore", 1: "reset", 2: "reboot", 3: "reset", 4: "reset"}


def action_of(code: int, text: str = "") -> str:
    """The action of one Xid; for 154 the one its message names, when it names one."""
    if code == 154:
        m = _RECOVERY.search(text)
        if m:
            return RECOVERY_ACTIONS.get(int(m.group(1), 16), "reset")
    return catalog().lookup(code).action
