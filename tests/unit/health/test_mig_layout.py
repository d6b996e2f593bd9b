"""The MIG record `nodeprep mig` writes (ROOT/var/lib/nodeprep/mig.json, node.migapply) as the health
service reads it to name a parent's MIG devices: only a successful record counts, and as input under
--root it is bounded and checked (a FIFO, a huge file, odd names are no record). Nothing GPU-like."""

from __future__ import annotations

import json
import os
from pathlib import Path

from nodeprep.health.service import MAX_RECORD, MIG_RECORD, mig_layout
from nodeprep.node import migapply


def _write(root: Path, data: object) -> Path:
    path = root / MIG_RECORD.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def test_the_record_the_mig_command_writes(tmp_path: Path) -> None:
    assert MIG_RECORD == migapply.STATE_FILE
    layout = [{"index": 0, "uuid": "GPU-a", "mig_devices": ["1g.10gb", "2g.20gb"]},
              {"index": 1, "uuid": "GPU-b", "mig_devices": []}]
    migapply.record(tmp_path, migapply.Outcome("mixed", "success", layout=layout))
    assert mig_layout(tmp_path) == {"GPU-a": ("MIG 1g.10gb Device 0", "MIG 2g.20gb Device 1")}
    migapply.record(tmp_path, migapply.Outcome("mixed", "failed", layout=layout, error="x"))
    assert mig_layout(tmp_path) == {}


def test_hostile_records_are_no_record(tmp_path: Path) -> None:
    assert mig_layout(tmp_path) == {}  # none
    bad = [{"uuid": "GPU-a", "mig_devices": ["1g.10gb; rm"]}]
    path = _write(tmp_path, {"state": "success", "layout": bad})
    assert mig_layout(tmp_path) == {}
    _write(tmp_path, {"state": "success", "layout": "all"})
    assert mig_layout(tmp_path) == {}
    path.write_text(" " * (MAX_RECORD + 1))
    assert mig_layout(tmp_path) == {}
    path.unlink()
    os.mkfifo(path)  # would block a plain open()
    assert mig_layout(tmp_path) == {}
