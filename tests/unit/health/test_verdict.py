"""The pure core of `nodeprep health` (nodeprep.health.verdict): observations in, GPU and node
verdicts out, and the hold against flapping. Observations are built here (nothing GPU-like runs);
tests/unit/health/test_health_mocknvml.py reads the same from NVIDIA's NVML mock."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nodeprep.health.verdict import (
    GpuObservation,
    Held,
    NodeVerdict,
    Observations,
    XidEvent,
    evaluate,
    settle,
    with_rates,
)

GPUS = tuple(GpuObservation(i, f"GPU-0000000{i}", f"00000000:{0x1A + i:02X}:00.0",
                            nvlink_active=(True,) * 18, fabric_state=3, fabric_status=0) for i in range(4))


def judge(*gpus: GpuObservation, xids: tuple[XidEvent, ...] = (), now: float = 100.0,
          window: float = 60.0) -> NodeVerdict:
    by_index = {g.index: g for g in GPUS} | {g.index: g for g in gpus}
    return evaluate(Observations(tuple(by_index.values()), xids), now, xid_window=window)


def test_all_healthy() -> None:
    v = judge()
    assert v.healthy and v.reason == "GPUsHealthy" and v.message == "all 4 GPUs healthy"
    assert v.to_dict()["condition"]["status"] == "True" and v.to_dict()["taint"] is False


@pytest.mark.parametrize("change, reason, action", [
    ({"lost": "GPU is lost"}, "GPULost", "reboot"),
    ({"ecc_uncorrected": 2}, "ECCUncorrected", "reset"),
    ({"remap_pending": True}, "RowRemapPending", "reset"),
    ({"remap_failure": True}, "RowRemapFailure", "replace"),
    ({"retired_pending": True}, "RetiredPagesPending", "reset"),
    ({"nvlink_active": (True,) * 17 + (False,)}, "NVLinkDown", "reset"),
    ({"fabric_state": 2}, "FabricNotReady", "reset"),
    ({"fabric_status": 15}, "FabricError", "reset"),
    ({"nvlink_error_rates": {"crc_flit": 50.0, "replay": 0.0}}, "NVLinkErrors", "reset"),
])
def test_each_fault_class(change: dict[str, object], reason: str, action: str) -> None:
    v = judge(replace(GPUS[2], **change))  # type: ignore[arg-type]
    assert not v.healthy and v.reason == reason and v.action == action
    assert v.message.startswith("GPU 2 (GPU-00000002, 00000000:1C:00.0): ")
    assert [g.healthy for g in v.gpus] == [True, True, False, True]


def test_no_nvlink_and_no_fabric_are_not_faults() -> None:
    """A board without NVLink (all links inactive: standalone B200, PCIe) and a GPU without fabric
    support (state NOT_SUPPORTED or no answer) are healthy."""
    v = judge(*(replace(g, nvlink_active=(False,) * 18, fabric_state=None) for g in GPUS[:2]),
              *(replace(g, nvlink_active=(), fabric_state=0) for g in GPUS[2:]))
    assert v.healthy


@pytest.mark.parametrize("code, text, action, healthy", [
    (79, "GPU has fallen off the bus.", "reboot", False),
    (48, "", "reset", False),
    (95, "Uncontained: FBHUB. RST: Yes", "reset", False),
    (119, "Timeout waiting for RPC from GSP", "reset", False),
    (154, "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", "reboot", False),
    (13, "Graphics Exception", "ignore", True),
    (43, "", "ignore", True),
    (4242, "", "reset", False),
])
def test_xids_by_the_catalog(code: int, text: str, action: str, healthy: bool) -> None:
    v = judge(xids=(XidEvent(code, 90.0, "kmsg", text, pci="0000:1b:00"),))
    gpu = v.gpus[1]
    assert gpu.healthy is healthy and v.healthy is healthy
    assert gpu.findings[0].reason == f"XID{code}" and gpu.findings[0].action == action
    if not healthy:
        assert v.reason == f"XID{code}" and "GPU 1 (GPU-00000001, 00000000:1B:00.0): Xid" in v.message


def test_nvml_events_name_the_gpu_by_index() -> None:
    v = judge(xids=(XidEvent(79, 99.0, "nvml", index=3),))
    assert v.reason == "XID79" and not v.gpus[3].healthy and v.gpus[0].healthy


def test_an_xid_counts_for_its_window_only() -> None:
    xid = (XidEvent(48, 10.0, "kmsg", pci="0000:1a:00"),)
    assert not judge(xids=xid, now=60.0, window=60.0).healthy
    assert judge(xids=xid, now=71.0, window=60.0).healthy


def test_an_xid_on_an_address_no_gpu_has_still_counts() -> None:
    v = judge(xids=(XidEvent(79, 99.0, "kmsg", pci="0000:99:00"),))
    assert not v.healthy and v.reason == "XID79" and "0000:99:00" in v.message
    assert all(g.healthy for g in v.gpus)


def test_mig_children_follow_their_parent() -> None:
    parent = replace(GPUS[0], mig_children=("MIG-aaaa", "MIG-bbbb"), ecc_uncorrected=1)
    v = judge(parent)
    migs = v.to_dict()["gpus"][0]["mig_devices"]
    assert migs == [{"uuid": "MIG-aaaa", "healthy": False, "parent": "GPU-00000000"},
                    {"uuid": "MIG-bbbb", "healthy": False, "parent": "GPU-00000000"}]
    healed = judge(replace(parent, ecc_uncorrected=0)).to_dict()["gpus"][0]["mig_devices"]
    assert all(m["healthy"] for m in healed)


def test_nvml_unavailable_is_unhealthy() -> None:
    v = evaluate(Observations((), nvml_error="nvmlInit: Driver Not Loaded"), 0.0, xid_window=60)
    assert not v.healthy and v.reason == "NVMLUnavailable" and "Driver Not Loaded" in v.message


def test_the_message_is_bounded() -> None:
    gpus = [replace(g, index=i, uuid="GPU-" + "x" * 200, lost="GPU is lost") for i, g in
            enumerate(GPUS * 4)]
    assert len(evaluate(Observations(tuple(gpus)), 0.0, xid_window=1).message) == 1024


def test_hold_unhealthy_at_once_healthy_after_the_hold() -> None:
    """Down at once; up only after `hold` seconds healthy without a break; a relapse restarts it."""
    bad = Observations(tuple(replace(g, lost="GPU is lost") if g.index == 1 else g for g in GPUS))
    good = Observations(GPUS)
    held = Held()
    held, v = settle(held, evaluate(good, 0, xid_window=1), 0, hold=30)
    assert v.healthy
    held, v = settle(held, evaluate(bad, 1, xid_window=1), 1, hold=30)
    assert not v.healthy and v.reason == "GPULost"
    held, v = settle(held, evaluate(good, 2, xid_window=1), 2, hold=30)
    assert not v.healthy and v.gpus[1].recovering == 30
    held, v = settle(held, evaluate(good, 20, xid_window=1), 20, hold=30)
    assert not v.healthy and v.reason == "GPULost"
    held, v = settle(held, evaluate(bad, 25, xid_window=1), 25, hold=30)  # relapse: the hold restarts
    held, v = settle(held, evaluate(good, 26, xid_window=1), 26, hold=30)
    held, v = settle(held, evaluate(good, 55, xid_window=1), 55, hold=30)
    assert not v.healthy
    held, v = settle(held, evaluate(good, 56, xid_window=1), 56, hold=30)
    assert v.healthy and v.reason == "GPUsHealthy"
    assert held == Held()


def test_hold_after_nvml_was_unavailable() -> None:
    """NVML gone then back: the node stays unhealthy for the hold, like a GPU."""
    gone = Observations((), nvml_error="nvmlInit: Driver Not Loaded")
    held, v = settle(Held(), evaluate(gone, 0, xid_window=1), 0, hold=30)
    assert v.reason == "NVMLUnavailable"
    held, v = settle(held, evaluate(Observations(GPUS), 1, xid_window=1), 1, hold=30)
    assert not v.healthy and v.reason == "NVMLUnavailable"
    held, v = settle(held, evaluate(Observations(GPUS), 31, xid_window=1), 31, hold=30)
    assert v.healthy and held == Held()


def test_nvlink_error_counters_judged_by_their_rise() -> None:
    """One read judges no counter; the rise between two reads over NVLINK_ERROR_RATE per second does;
    a counter that went back to zero (reset) rose by nothing."""
    before = Observations(tuple(replace(g, nvlink_errors={"crc_flit": 1000, "replay": 7}) for g in GPUS))
    assert evaluate(before, 100.0, xid_window=60).healthy
    after = Observations(tuple(replace(g, nvlink_errors={"crc_flit": 1000 + 300 * (g.index == 1),
                                                         "replay": 7}) for g in GPUS))
    v = evaluate(with_rates(before, after, 2.0), 100.0, xid_window=60)
    assert not v.healthy and v.reason == "NVLinkErrors"
    assert "GPU 1 (GPU-00000001, 00000000:1B:00.0): NVLink error counters rising (crc_flit 150/s)" \
        in v.message
    reset = Observations(tuple(replace(g, nvlink_errors={"crc_flit": 0, "replay": 0}) for g in GPUS))
    assert evaluate(with_rates(after, reset, 2.0), 100.0, xid_window=60).healthy
    slow = Observations(tuple(replace(g, nvlink_errors={"crc_flit": 1001, "replay": 7}) for g in GPUS))
    assert evaluate(with_rates(before, slow, 2.0), 100.0, xid_window=60).healthy  # 0.5/s: under the rate


def test_a_failed_parent_names_its_mig_devices_in_the_message() -> None:
    children = ("MIG 1g.10gb Device 0", "MIG 1g.10gb Device 1")
    parent = replace(GPUS[0], mig_children=children, lost="GPU is lost")
    v = judge(parent)
    assert v.message.startswith("GPU 0 (GPU-00000000, 00000000:1A:00.0) (with its MIG devices MIG 1g.10gb "
                                "Device 0, MIG 1g.10gb Device 1): NVML cannot reach the GPU")
    assert v.to_dict()["gpus"][0]["mig_devices"][0] == {"name": "MIG 1g.10gb Device 0", "healthy": False,
                                                        "parent": "GPU-00000000"}
