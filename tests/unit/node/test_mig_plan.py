"""The MIG planner (nodeprep.node.migplan) on GPU states written out here (pure: nothing GPU-like runs;
NVML's own answers, through NVIDIA's NVML mock, are tests/unit/node/test_mig_nvml_mock.py).

The GPUs are an 8-GPU HGX H100 80GB (PCI id 0x233010DE) with the GPU instance profiles NVML lists
for that board (nvidia-smi mig -lgip on an H100 80GB: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb,
4g.40gb, 7g.80gb) and an A100 40GB (0x20B010DE)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

from nodeprep.node.migplan import GpuMig, MigPlan, creation_order, plan
from nodeprep.profile import parse_profile

H100_PROFILES = ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
A100_PROFILES = ("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")


def h100(i: int, mig: bool = False, pending: bool | None = None, devices: tuple[str, ...] = ()) -> GpuMig:
    return GpuMig(index=i, uuid=f"GPU-h100-{i}", name="NVIDIA H100 80GB HBM3", pci_id="0x233010DE",
                  capable=True, current=mig, pending=mig if pending is None else pending,
                  profiles=H100_PROFILES, devices=devices)


def a100(i: int) -> GpuMig:
    return GpuMig(index=i, uuid=f"GPU-a100-{i}", name="NVIDIA A100-SXM4-40GB", pci_id="0x20B010DE",
                  capable=True, current=False, pending=False, profiles=A100_PROFILES)


def spec(configs: dict[str, Any]) -> dict[str, Any]:
    """A mig.config read through the profile's own parser (what the planner is given)."""
    p = parse_profile({"driver": {"version": "550.163.01"}, "mig": {
        "config": {"version": "v1", "mig-configs": configs}, "select": next(iter(configs))}})
    assert p.mig.config is not None
    return p.mig.config


ALL_1G = {"all-1g.10gb": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]}
ALL_OFF = {"all-disabled": [{"devices": "all", "mig-enabled": False}]}
MIXED = {"balanced": [{"devices": [0, 1, 2, 3], "mig-enabled": True,
                       "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}},
                      {"devices": [4, 5, 6, 7], "mig-enabled": False}]}


def applied(gpus: list[GpuMig], p: MigPlan) -> list[GpuMig]:
    """The GPUs as they are once `p` has been carried out (what NVML would then report)."""
    out = []
    by_index = {g.index: g for g in p.gpus}
    for g in gpus:
        step = by_index.get(g.index)
        if step is None or not step.changes:
            out.append(g)
            continue
        devices = [d for d in g.devices if d not in step.destroy] if step.destroy != g.devices else []
        out.append(replace(g, current=step.mig_enabled, pending=step.mig_enabled,
                           devices=tuple(devices) + step.create))
    return out


def test_enable_and_create_then_nothing_to_do() -> None:
    gpus = [h100(i) for i in range(8)]
    first = plan(gpus, spec(ALL_1G), "all-1g.10gb")
    assert not first.problems and first.changes
    assert first.lines()[0] == "GPU 0 (NVIDIA H100 80GB HBM3): enable MIG mode, then create 7x 1g.10gb"
    second = plan(applied(gpus, first), spec(ALL_1G), "all-1g.10gb")
    assert not second.changes and not second.problems
    assert second.lines()[0] == "GPU 0 (NVIDIA H100 80GB HBM3): in place: MIG enabled, 7x 1g.10gb"


def test_a_different_layout_destroys_all_and_creates_the_largest_first() -> None:
    gpus = [h100(i, mig=True, devices=("1g.10gb",) * 7) for i in range(4)] + [h100(i) for i in range(4, 8)]
    p = plan(gpus, spec(MIXED), "balanced")
    assert not p.problems
    g0 = p.gpus[0]
    assert g0.mode is None and g0.destroy == ("1g.10gb",) * 7
    assert g0.create == ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb")
    assert p.lines()[0] == ("GPU 0 (NVIDIA H100 80GB HBM3): destroy 7x 1g.10gb, then create 1x 3g.40gb, "
                            "1x 2g.20gb, 2x 1g.10gb")
    assert [g.changes for g in p.gpus[4:]] == [False] * 4  # MIG already off there
    assert not plan(applied(gpus, p), spec(MIXED), "balanced").changes


def test_the_same_devices_in_another_order_are_in_place() -> None:
    gpus = [h100(0, mig=True, devices=("1g.10gb", "3g.40gb", "2g.20gb", "1g.10gb"))]
    cfg = spec({"one": [{"devices": [0], "mig-enabled": True,
                         "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}]})
    assert not plan(gpus, cfg, "one").changes


def test_disable_destroys_first() -> None:
    gpus = [h100(0, mig=True, devices=("7g.80gb",))]
    p = plan(gpus, spec(ALL_OFF), "all-disabled")
    assert p.lines() == ["GPU 0 (NVIDIA H100 80GB HBM3): destroy 1x 7g.80gb, then disable MIG mode"]
    assert not plan(applied(gpus, p), spec(ALL_OFF), "all-disabled").changes


def test_a_mode_set_but_not_in_effect_is_a_pending_reset() -> None:
    gpus = [h100(0, mig=False, pending=True)]
    cfg = spec({"on": [{"devices": "all", "mig-enabled": True, "mig-devices": {}}]})
    p = plan(gpus, cfg, "on")
    assert not p.changes and p.gpus[0].reset_pending
    assert p.lines() == ["GPU 0 (NVIDIA H100 80GB HBM3): in place: MIG enabled (takes effect at the next "
                         "GPU reset)"]


def test_device_filter_and_untouched_gpus() -> None:
    gpus = [a100(0), h100(1), a100(2)]
    cfg = spec({"a100s": [{"device-filter": ["0x20b010de"], "devices": "all", "mig-enabled": True,
                           "mig-devices": {"3g.20gb": 2}}]})
    p = plan(gpus, cfg, "a100s")
    assert [g.index for g in p.gpus] == [0, 2] and p.untouched == (1,)
    assert p.lines()[-1] == "GPU 1: not named by a100s; left as they are"


def test_problems_refuse_the_plan() -> None:
    gpus = [h100(i) for i in range(2)]
    absent = plan(gpus, spec({"x": [{"devices": [0, 5, 9], "mig-enabled": False}]}), "x")
    assert absent.problems == ("mig.config: mig-configs.x[0].devices: no GPU 5, 9 on this node (GPUs: 0, 1)",)
    twice = plan(gpus, spec({"x": [{"devices": "all", "mig-enabled": False},
                                   {"devices": [1], "mig-enabled": False}]}), "x")
    assert twice.problems == ("mig.config: mig-configs.x[1]: GPU 1 is already named by entry 0",)
    offered = plan(gpus, spec({"x": [{"devices": "all", "mig-enabled": True,
                                      "mig-devices": {"1g.5gb": 7}}]}), "x")
    assert offered.problems == ("mig.config: mig-configs.x[0]: GPU 0, 1 (NVIDIA H100 80GB HBM3): MIG profile "
                                "1g.5gb not offered (it offers 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, "
                                "3g.40gb, 4g.40gb, 7g.80gb)",)
    t4 = GpuMig(index=0, uuid="GPU-t4", name="Tesla T4", pci_id="0x1EB810DE", capable=False, current=False,
                pending=False)
    assert plan([t4], spec(ALL_1G), "all-1g.10gb").problems == (
        "mig.config: mig-configs.all-1g.10gb[0]: GPU 0 (Tesla T4): not MIG-capable (NVML has no MIG "
        "mode for it)",)
    assert not plan([t4], spec(ALL_OFF), "all-disabled").problems  # nothing to do on it


def test_compute_instance_profiles_and_the_creation_order() -> None:
    assert creation_order([("1g.10gb", 1), ("1c.3g.40gb", 1), ("3g.40gb", 1), ("2c.2g.20gb", 1)]) == (
        "3g.40gb", "1c.3g.40gb", "2g.20gb", "1g.10gb")
    cfg = spec({"c": [{"devices": [0], "mig-enabled": True, "mig-devices": {"1c.4g.40gb": 2}}]})
    p = plan([h100(0, mig=True)], cfg, "c")
    assert not p.problems and Counter(p.gpus[0].create) == {"1c.4g.40gb": 2}
