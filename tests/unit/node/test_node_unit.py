"""The systemd unit nodeprep writes, parsed back as an INI file."""

from __future__ import annotations

import configparser
from pathlib import Path

from nodeprep.node.layout import Layout
from nodeprep.node.system import nodeprep_command, render_unit


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


def test_command_in_an_image_is_found_on_systemds_path(tmp_path: Path) -> None:
    assert nodeprep_command(Layout(tmp_path)) == "nodeprep"
    live = nodeprep_command(Layout(Path("/")))
    assert live.startswith("/") and "nodeprep" in live
