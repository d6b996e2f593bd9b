"""The node the GPU self-test reads, built small: a root with a driver version active under
/opt/nvidia (its manifest, `current` pointing at it) and a sysfs with the loaded module's version and
NVIDIA GPUs at the given PCI bus addresses."""

from __future__ import annotations

from pathlib import Path

from nodeprep.artifact import MANIFEST


def driver_node(tmp_path: Path, active: str, loaded: str | None, buses: list[str]) -> tuple[Path, Path]:
    """(tmp_path/root, tmp_path/sys): `active` installed and current; with `loaded`, module/nvidia's
    version; a 3D controller of vendor 0x10de at each of `buses`."""
    root, sysfs = tmp_path / "root", tmp_path / "sys"
    (root / "opt/nvidia" / active).mkdir(parents=True)
    (root / "opt/nvidia" / active / MANIFEST).write_text("{}")
    (root / "opt/nvidia/current").symlink_to(active)
    if loaded:
        (sysfs / "module/nvidia").mkdir(parents=True)
        (sysfs / "module/nvidia/version").write_text(loaded + "\n")
    for bus in buses:
        d = sysfs / "bus/pci/devices" / bus
        d.mkdir(parents=True)
        (d / "vendor").write_text("0x10de\n")
        (d / "class").write_text("0x030200\n")
    return root, sysfs
