"""The systemd unit nodeprep writes, parsed back as an INI file."""

from __future__ import annotations

import configparser
from pathlib import Path

from nodeprep.node.driverplan import daemon_commands, dropped_daemon_commands
from nodeprep.node.integration import command_problem, nodeprep_command, render_persistenced_unit, render_unit
from nodeprep.node.layout import Layout


def parse(text: str) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string(text)
    return cp


def test_unit_orders_before_runtime_and_loads_modules() -> None:
    unit = parse(render_unit("nodeprep", ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm")))
    assert unit["Unit"]["Before"].split() == ["containerd.service", "kubelet.service"]
    assert unit["Unit"]["ConditionPathExists"] == "/opt/nvidia/current/manifest.json"
    assert unit["Service"]["Type"] == "oneshot" and unit["Service"]["RemainAfterExit"] == "yes"
    assert (
        unit["Service"]["ExecStart"]
        == "nodeprep load-modules --modules nvidia,nvidia-uvm,nvidia-modeset,nvidia-drm"
    )
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_the_unit_runs_the_roots_own_nodeprep_on_a_live_node_too() -> None:
    # never the interpreter or checkout running this install: an upgrade or a moved venv breaks those
    assert nodeprep_command() == "nodeprep"
    unit = render_unit(nodeprep_command())
    assert "python" not in unit and "nodeprep.cli" not in unit


def test_command_problem_follows_the_roots_links_and_interpreter(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    assert "has no `nodeprep` on its PATH" in str(command_problem(layout))
    # the cloud-init installer's shape: /usr/local/bin/nodeprep -> the venv's entry point
    venv = tmp_path / "opt/nodeprep/venv/bin"
    venv.mkdir(parents=True)
    (venv / "nodeprep").write_text("#!/opt/nodeprep/venv/bin/python3\nimport nodeprep\n")
    (venv / "nodeprep").chmod(0o755)
    (tmp_path / "usr/local/bin").mkdir(parents=True)
    (tmp_path / "usr/local/bin/nodeprep").symlink_to("/opt/nodeprep/venv/bin/nodeprep")  # absolute: in ROOT
    problem = str(command_problem(layout))
    assert "/usr/local/bin/nodeprep runs /opt/nodeprep/venv/bin/python3, which it does not have" in problem
    (tmp_path / "usr/bin").mkdir()
    (tmp_path / "usr/bin/python3.11").write_text("")
    (venv / "python3").symlink_to("/usr/bin/python3.11")
    assert command_problem(layout) is None


def test_persistenced_unit_runs_the_active_versions_daemon_after_the_modules() -> None:
    """The unit runs nvidia-persistenced through /opt/nvidia/current (so it follows every switch),
    needs the module-load unit and is part of it (stopping that one stops the daemon first)."""
    unit = parse(render_persistenced_unit())
    assert unit["Service"]["ExecStart"] == "/opt/nvidia/current/bin/nvidia-persistenced --verbose"
    assert unit["Service"]["Type"] == "forking"
    assert unit["Unit"]["ConditionPathExists"] == "/opt/nvidia/current/bin/nvidia-persistenced"
    for key in ("Requires", "After", "PartOf"):
        assert unit["Unit"][key] == "nodeprep-nvidia.service", key
    assert unit["Unit"]["Before"].split() == ["containerd.service", "kubelet.service"]
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    assert render_persistenced_unit().startswith("# Written by nodeprep")  # how uninstall knows it


def test_daemon_commands_follow_the_switch_on_a_live_root_only() -> None:
    unit = "nodeprep-persistenced.service"
    assert daemon_commands(unit, live=False, loaded=True, unit_changed=True, switched=True) == []
    assert daemon_commands(unit, live=True, loaded=True, unit_changed=True, switched=True) == [
        ["systemctl", "daemon-reload"], ["systemctl", "restart", unit]]
    assert daemon_commands(unit, live=True, loaded=True, unit_changed=False, switched=True) == [
        ["systemctl", "restart", unit]]  # the switch: the daemon of the new version
    assert daemon_commands(unit, live=True, loaded=True, unit_changed=False, switched=False) == [
        ["systemctl", "start", unit]]  # a re-run: started when it is not running, else nothing
    # another version's module still loaded: the new daemon would refuse it; the reboot starts it
    assert daemon_commands(unit, live=True, loaded=False, unit_changed=True, switched=True) == [
        ["systemctl", "daemon-reload"]]


def test_a_daemon_switched_off_stops_on_a_live_root_only() -> None:
    unit = "nodeprep-fabricmanager.service"
    assert dropped_daemon_commands(unit, live=False) == []
    assert dropped_daemon_commands(unit, live=True) == [["systemctl", "stop", unit],
                                                        ["systemctl", "daemon-reload"]]
