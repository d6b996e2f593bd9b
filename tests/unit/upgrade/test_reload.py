"""Reload or reboot (nodeprep.upgrade.reload): `decide` over surveys, and `survey` over a sysfs and a
proc tree laid out as the kernel shows them (module refcnt/holders, fd links). No GPU, no module is
loaded here: the trees are files a test writes."""

from __future__ import annotations

import os
from pathlib import Path

from nodeprep.upgrade.reload import (
    REBOOT,
    RELOAD,
    GpuProcess,
    ModuleUse,
    Survey,
    decide,
    survey,
    unload_order,
)


def test_nothing_loaded_loads_and_same_version_does_nothing() -> None:
    assert decide(Survey(None, (), ()), "550.1").action == "load"
    assert decide(Survey("550.1", (), ()), "550.1").action == "none"


def test_stack_references_do_not_hold_it() -> None:
    s = Survey(
        "535.2",
        (
            ModuleUse("nvidia", 2, ("nvidia_modeset", "nvidia_uvm")),
            ModuleUse("nvidia_uvm", 0, ()),
            ModuleUse("nvidia_modeset", 0, ()),
        ),
        (),
    )
    d = decide(s, "550.1")
    assert d.action == RELOAD and not d.to_dict()["reboot_required"]


def test_an_open_device_a_foreign_holder_or_a_gpu_process_means_reboot() -> None:
    open_fd = Survey("535.2", (ModuleUse("nvidia", 3, ("nvidia_modeset", "nvidia_uvm")),), ())
    d = decide(open_fd, "550.1")
    assert d.action == REBOOT and "module nvidia is in use (reference count 3, 2 of them" in d.reasons[1]
    foreign = Survey("535.2", (ModuleUse("nvidia", 1, ("nv_peer_mem",)),), ())
    assert "module nvidia is held by nv_peer_mem" in decide(foreign, "550.1").reasons
    proc = Survey("535.2", (ModuleUse("nvidia", 0, ()),), (GpuProcess(42, "python3", "/dev/nvidia0"),))
    assert decide(proc, "550.1").reasons[-1] == "process 42 (python3) has /dev/nvidia0 open"


def test_survey_reads_refcnt_holders_and_fd_links(tmp_path: Path) -> None:
    sysfs, proc = tmp_path / "sys", tmp_path / "proc"
    nv = sysfs / "module/nvidia"
    (nv / "holders").mkdir(parents=True)
    (nv / "version").write_text("535.309.01\n")
    (nv / "refcnt").write_text("2\n")
    (nv / "holders/nvidia_uvm").mkdir()
    (sysfs / "module/nvidia_uvm").mkdir()
    (sysfs / "module/nvidia_uvm/refcnt").write_text("0\n")
    (sysfs / "module/nvidia_uvm/holders").mkdir()
    (proc / "77/fd").mkdir(parents=True)
    (proc / "77/comm").write_text("trainer\n")
    os.symlink("/dev/nvidia0", proc / "77/fd/5")
    (proc / "78/fd").mkdir(parents=True)
    os.symlink("/dev/null", proc / "78/fd/0")
    s = survey(sysfs, proc)
    assert s.loaded_version == "535.309.01"
    assert s.modules == (ModuleUse("nvidia", 2, ("nvidia_uvm",)), ModuleUse("nvidia_uvm", 0, ()))
    assert s.processes == (GpuProcess(77, "trainer", "/dev/nvidia0"),)
    d = decide(s, "550.1")
    assert d.action == REBOOT  # refcnt 2 with one stack holder: one more reference, and pid 77
    os.unlink(proc / "77/fd/5")
    (nv / "refcnt").write_text("1\n")
    assert decide(survey(sysfs, proc), "550.1").action == RELOAD


def test_a_missing_refcount_is_a_reason_to_reboot(tmp_path: Path) -> None:
    (tmp_path / "module/nvidia").mkdir(parents=True)
    (tmp_path / "module/nvidia/version").write_text("535.2")
    d = decide(survey(tmp_path, tmp_path / "noproc"), "550.1")
    assert d.action == REBOOT and any("no reference count" in r for r in d.reasons)


def test_unload_order_holders_first() -> None:
    assert unload_order(["nvidia", "gdrdrv", "nvidia_fs", "nvidia_uvm"]) == [
        "gdrdrv", "nvidia_fs", "nvidia_uvm", "nvidia"]
    assert unload_order(["nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset"]) == [
        "nvidia_drm",
        "nvidia_modeset",
        "nvidia_uvm",
        "nvidia",
    ]
