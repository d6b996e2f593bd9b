"""The GPU self-test: facts from a fake sysfs and driver root, GPU facts from recorded `nvidia-smi -q -x`
captures (tests/fixtures/nvidia-smi; no GPU here). The verdict logic for row remaps and page retirement
is also checked on constructed facts: no capture shows a failing GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from nodeprep.cli import main
from nodeprep.node.selftest import GpuHealth, SelfTestFacts, evaluate, gather, parse_health
from tests.support.drivertree import driver_node

CAPTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia-smi"
T4 = CAPTURES / "tesla-t4_515.105.01.xml"  # 515.105.01, bus 00000000:00:1E.0, persistence Disabled
A5000 = CAPTURES / "dual-rtx-a5000_590.44.01.xml"  # two GPUs, persistence Enabled


def node(tmp_path: Path, active: str, loaded: str | None, buses: list[str]) -> tuple[Path, Path]:
    root, sysfs = driver_node(tmp_path, active, loaded, buses)
    other = sysfs / "bus/pci/devices/0000:00:02.0"  # an Intel VGA controller is not ours
    other.mkdir(parents=True)
    (other / "vendor").write_text("0x8086\n")
    (other / "class").write_text("0x030000\n")
    return root, sysfs


def test_t4_passes(tmp_path: Path) -> None:
    root, sysfs = node(tmp_path, "515.105.01", "515.105.01", ["0000:00:1e.0"])
    verdict = evaluate(gather(root, sysfs, nvidia_smi_xml=T4))
    assert verdict.passed and verdict.problems == () and verdict.driver_version == "515.105.01"


def test_each_failure_is_one_line(tmp_path: Path) -> None:
    root, sysfs = node(tmp_path, "515.105.01", "535.54.03", ["0000:00:1e.0", "0000:3b:00.0"])
    verdict = evaluate(gather(root, sysfs, nvidia_smi_xml=T4, persistence_mode="enabled"))
    assert not verdict.passed
    assert verdict.problems == (
        "module: loaded nvidia module is 535.54.03, the active driver is 515.105.01 (reboot or reload the "
        "modules)",
        "module: nvidia-smi reports driver 515.105.01, the loaded module is 535.54.03",
        "visibility: GPU 0000:3b:00.0 is on the PCI bus but not visible to the driver",
        "persistence: GPU 0000:00:1e.0 has persistence mode disabled, the profile asks for enabled",
    )


def test_no_module_no_gpu(tmp_path: Path) -> None:
    root, sysfs = node(tmp_path, "515.105.01", None, [])
    verdict = evaluate(gather(root, sysfs))
    assert verdict.problems == ("module: the nvidia kernel module is not loaded",
                                "visibility: no NVIDIA GPU on the PCI bus")


def test_two_gpus_persistence_enabled(tmp_path: Path) -> None:
    _, gpus = parse_health(A5000.read_bytes())
    assert len(gpus) == 2 and all(g.persistence for g in gpus)
    assert all(g.remap_pending is False and g.remap_failure is False for g in gpus)
    root, sysfs = node(tmp_path, "590.44.01", "590.44.01", [g.bus_id for g in gpus])
    assert evaluate(gather(root, sysfs, nvidia_smi_xml=A5000, persistence_mode="enabled")).passed
    assert not evaluate(gather(root, sysfs, nvidia_smi_xml=A5000, persistence_mode="disabled")).passed


@pytest.mark.parametrize(("health", "problem"), [
    (GpuHealth("0000:01:00.0", remap_pending=True), "has a pending row remap"),
    (GpuHealth("0000:01:00.0", remap_failure=True), "had a row-remap failure"),
    (GpuHealth("0000:01:00.0", retirement_pending=True), "has pages pending retirement"),
])
def test_memory_problems(health: GpuHealth, problem: str) -> None:
    facts = SelfTestFacts("535.54.03", "535.54.03", "535.54.03", ("0000:01:00.0",), (health,))
    verdict = evaluate(facts)
    assert not verdict.passed and len(verdict.problems) == 1 and problem in verdict.problems[0]


def test_cli_exit_codes(tmp_path: Path) -> None:
    root, sysfs = node(tmp_path, "515.105.01", "515.105.01", ["0000:00:1e.0"])
    args = ["verify-gpus", "--root", str(root), "--sysfs-root", str(sysfs), "--nvidia-smi-xml", str(T4)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0 and "GPU self-test passed (driver 515.105.01)" in r.stdout
    r = CliRunner().invoke(main, [*args, "--persistence-mode", "enabled"])
    assert r.exit_code == 1
    assert r.stderr.strip().splitlines() == [
        "error: GPU self-test failed: persistence: GPU 0000:00:1e.0 has persistence mode disabled, the "
        "profile asks for enabled"]
    r = CliRunner().invoke(main, [*args, "--apply"])
    assert r.exit_code == 2 and "--apply needs --kubeconfig" in r.stderr


def test_the_wait_reads_again_until_the_fabric_completes() -> None:
    """wait_fabric over its explicit inputs (no GPU, no mock): NVML answers In Progress twice, then
    Completed; then one that stays In Progress is given up after the timeout."""
    from nodeprep.node.selftest import GpuHealth, wait_fabric

    answers = iter(["In Progress", "In Progress", "Completed"])
    now = [0.0]
    slept: list[float] = []

    def read() -> tuple[str, tuple[GpuHealth, ...]]:
        return "550.163.01", (GpuHealth("0000:1a:00.0", fabric_state=next(answers)),)

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    got = wait_fabric(read, 10, interval=2, clock=lambda: now[0], sleep=sleep)
    assert got is not None and got[1][0].fabric_state == "Completed" and slept == [2, 2]
    stuck = wait_fabric(lambda: ("550.163.01", (GpuHealth("0000:1a:00.0", fabric_state="In Progress"),)), 3,
                        interval=2, clock=lambda: now[0], sleep=sleep)
    assert stuck is not None and stuck[1][0].fabric_state == "In Progress"  # gave up after 3 s


H200 = Path(__file__).resolve().parents[2] / "fixtures" / "gpu-machine" / "h200_580.159.04.xml"


def test_the_fabric_state_of_an_nvidia_smi_capture_is_read_too(tmp_path: Path) -> None:
    """Where NVML cannot be loaded, nvidia-smi's <fabric><state> says the same: the recorded H200
    capture has none (N/A: no NVLink fabric) and passes; a capture derived from it by this test with
    `In Progress` (Fabric Manager not done) fails with the state in the problem."""
    root, sysfs = node(tmp_path, "580.159.04", "580.159.04", ["0000:00:06.0"])
    args = ["verify-gpus", "--root", str(root), "--sysfs-root", str(sysfs)]
    r = CliRunner().invoke(main, [*args, "--nvidia-smi-xml", str(H200)])
    assert r.exit_code == 0, r.output
    derived = tmp_path / "h200-fabric-in-progress.xml"
    text = H200.read_text()
    head, tail = text.split("<fabric>", 1)
    state = tail.index("<state>N/A</state>")
    derived.write_text(head + "<fabric>" + tail[:state] + "<state>In Progress</state>"
                       + tail[state + len("<state>N/A</state>"):])
    r = CliRunner().invoke(main, [*args, "--nvidia-smi-xml", str(derived)])
    assert r.exit_code == 1
    assert r.stderr.strip().splitlines() == [
        "error: GPU self-test failed: fabric: GPU 0000:00:06.0 fabric state In Progress (Fabric Manager has "
        "not registered it; CUDA fails with error 802 until it has)"]
