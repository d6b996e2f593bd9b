"""The profile's health section and the join: health.hold reaches the unit's `--hold` (and the join's
--health-hold flag overrides it), health.enabled false writes no health unit, and uninstall removes a
health unit an earlier join wrote whatever the profile says now. GPU facts: a real `nvidia-smi -q -x`
capture (conftest.py); nothing GPU-like runs."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from nodeprep.health.unit import DROP_IN_PATH, UNIT_PATH

from .test_join import join_args, profile, run_join


def _with_health(path: Path, **health: object) -> Path:
    data = yaml.safe_load(path.read_text())
    data["health"] = health
    path.write_text(yaml.safe_dump(data))
    return path


def test_hold_reaches_the_unit_and_the_flag_overrides_it(node_root: Path, tmp_path: Path,
                                                         smi_xml: Path) -> None:
    prof = _with_health(profile(tmp_path), hold=30)
    code, out, err = run_join(join_args(node_root, prof, smi_xml, "--check"))
    assert code == 0, err
    assert f"# ---- {UNIT_PATH} (mode " in out and " --hold 30 --xid-window 3600" in out
    code, out, err = run_join(join_args(node_root, prof, smi_xml, "--check", "--health-hold", "90"))
    assert code == 0, err
    assert " --hold 90 --xid-window 3600" in out and " --hold 30 " not in out


def test_disabled_writes_no_unit_and_uninstall_still_removes_one(node_root: Path, tmp_path: Path,
                                                                 smi_xml: Path) -> None:
    prof = _with_health(profile(tmp_path), enabled=False)
    code, out, err = run_join(join_args(node_root, prof, smi_xml, "--check"))
    assert code == 0, err
    assert UNIT_PATH not in out and DROP_IN_PATH not in out and "would write 9 file(s)" in err
    (tmp_path / "on").mkdir()
    code, out, err = run_join(join_args(node_root, profile(tmp_path / "on"), smi_xml, "--output-dir",
                                        str(tmp_path / "out"), "--check"))
    assert code == 0, err
    for target in (UNIT_PATH, DROP_IN_PATH):  # a unit an earlier join wrote
        dest = node_root / target.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes((tmp_path / "out" / target.lstrip("/")).read_bytes())
    node_profile = node_root / "etc/nodeprep/node.yaml"  # the node's profile says health.enabled: false
    node_profile.parent.mkdir(parents=True, exist_ok=True)
    node_profile.write_bytes(prof.read_bytes())
    code, out, err = run_join(["uninstall", "--check", "--json", "--root", str(node_root)])
    assert code == 0, err
    assert {UNIT_PATH, DROP_IN_PATH} <= set(json.loads(out)["remove"])
