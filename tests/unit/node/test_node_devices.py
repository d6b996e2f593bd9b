"""Device-node plan from /proc/devices and /proc/driver/nvidia/gpus.

Stand-in: the text below follows the kernel's /proc/devices format (fs/char_dev.c, "%3d %s\n" per
character device, then "Block devices:"), with the entries the NVIDIA driver registers (195
nvidia-frontend, dynamic nvidia-uvm and nvidia-caps majors, the names nvidia-container-toolkit looks
up); no GPU machine is available to record one here.
"""

from __future__ import annotations

from pathlib import Path

from nodeprep.node.devices import DeviceNode, device_nodes, parse_gpu_minors, parse_proc_devices

PROC_DEVICES = """Character devices:
  1 mem
  4 /dev/vc/0
  4 tty
195 nvidia-frontend
226 drm
234 nvidia-uvm
235 nvidia-caps

Block devices:
  7 loop
259 blkext
"""


def test_parse_proc_devices() -> None:
    majors = parse_proc_devices(PROC_DEVICES)
    assert majors["nvidia-frontend"] == 195 and majors["nvidia-uvm"] == 234 and majors["mem"] == 1
    assert "loop" not in majors  # block devices are not character devices


def test_gpu_minors(tmp_path: Path) -> None:
    for bus, minor in (("0000:3b:00.0", 1), ("0000:18:00.0", 0)):
        d = tmp_path / bus
        d.mkdir()
        (d / "information").write_text(
            f"Model: \t\t NVIDIA H100 80GB HBM3\nBus Location: \t {bus}\n"
            f"Device Minor: \t {minor}\nGPU Excluded:\t No\n"
        )
    assert parse_gpu_minors(tmp_path) == [0, 1]
    assert parse_gpu_minors(tmp_path / "missing") == []


def test_device_nodes() -> None:
    nodes = device_nodes(parse_proc_devices(PROC_DEVICES), [0, 1], ("nvidia", "nvidia-uvm", "nvidia-modeset"))
    assert nodes == [
        DeviceNode("/dev/nvidiactl", 195, 255),
        DeviceNode("/dev/nvidia0", 195, 0),
        DeviceNode("/dev/nvidia1", 195, 1),
        DeviceNode("/dev/nvidia-modeset", 195, 254),
        DeviceNode("/dev/nvidia-uvm", 234, 0),
        DeviceNode("/dev/nvidia-uvm-tools", 234, 1),
    ]
    only = device_nodes(parse_proc_devices(PROC_DEVICES), [0], ("nvidia",))
    assert [n.path for n in only] == ["/dev/nvidiactl", "/dev/nvidia0"]
    assert device_nodes({}, [0], ("nvidia",)) == []
