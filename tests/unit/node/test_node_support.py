"""GPU support check before load, against NVIDIA's real supported-gpus.json of 535.309.01 and
550.163.01 (tests/unit/data/supported-gpus/, see SOURCES.md) and PCI sysfs trees made from real
device ids: the nvidia-smi captures' GPUs (A100 SXM4 20b2, RTX A5000 2231, RTX PRO 6000 Blackwell
Max-Q 2bb4, Tesla T4 1eb8, each with its captured subsystem id) and 10de:2330 H100 SXM,
10de:1db6 V100, 10de:15f8 P100, 10de:2b85 (Blackwell), 10de:1180 GTX 680 (Kepler)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from nodeprep.artifact import MANIFEST
from nodeprep.errors import InputError
from nodeprep.node import doctor, support
from nodeprep.node.layout import Layout

DATA = Path(__file__).resolve().parents[1] / "data" / "supported-gpus"
LISTS = {
    v: gzip.decompress((DATA / f"{v}.json.gz").read_bytes()).decode() for v in ("535.309.01", "550.163.01")
}


def sysfs(root: Path, *gpus: str, bridge: bool = True) -> Path:
    """ROOT/sys/bus/pci/devices with one NVIDIA device per 'DEVICE[:SUBVENDOR:SUBDEVICE]'."""
    base = root / "sys" / "bus" / "pci" / "devices"
    for i, gpu in enumerate(gpus):
        dev, *sub = gpu.split(":")
        d = base / f"0000:{0x1b + i:02x}:00.0"
        d.mkdir(parents=True)
        attrs = {"vendor": "0x10de", "device": f"0x{dev}", "class": "0x030200"}
        if sub:
            attrs |= {"subsystem_vendor": f"0x{sub[0]}", "subsystem_device": f"0x{sub[1]}"}
        for k, v in attrs.items():
            (d / k).write_text(v + "\n")
    if bridge:  # an NVSwitch (class 0x0680) and a non-NVIDIA NIC are not GPUs
        for name, attrs in (("0000:05:00.0", ("0x10de", "0x22a3", "0x068000")),
                            ("0000:06:00.0", ("0x15b3", "0x101d", "0x020000"))):
            (base / name).mkdir(parents=True)
            for k, v in zip(("vendor", "device", "class"), attrs, strict=True):
                (base / name / k).write_text(v + "\n")
    return root


def check(version: str, flavour: str, *ids: str, notes: list[str] | None = None) -> list[str]:
    others = {v: t for v, t in LISTS.items() if v != version}
    return support.check_support(LISTS[version], flavour, list(ids), driver_version=version,
                                 alternatives=others, notes=notes)


@pytest.mark.parametrize("version", sorted(LISTS))
def test_datacenter_gpus_of_the_captures_are_supported_by_both_flavours(version):
    ids = ["10de:2330", "10de:20b2:10de:147f", "10de:2231:10de:147e"]
    assert check(version, "proprietary", *ids) == []
    assert check(version, "open", *ids) == []
    assert check(version, "proprietary", "10de:1db6", "10de:15f8") == []


def test_open_flavour_on_pre_turing_names_gpu_id_and_the_choice():
    assert check("550.163.01", "open", "10de:1db6") == [
        "Tesla V100-PCIE-32GB (PCI 10de:1db6) is not supported by the open kernel modules of 550.163.01 "
        "(NVIDIA lists no 'kernelopen' for it: GPUs before Turing need the proprietary modules); use the "
        "proprietary flavour of 550.163.01; supported by: 535.309.01 (proprietary)"
    ]
    assert check("535.309.01", "open", "10de:15f8")[0].startswith(
        "Tesla P100-PCIE-16GB (PCI 10de:15f8) is not supported by the open kernel modules of 535.309.01")


def test_gpu_newer_than_the_branch():
    for gpu in ("10de:2b85", "10de:2bb4:10de:204c"):
        (line,) = check("550.163.01", "proprietary", gpu)
        assert f"(PCI {gpu[:9]}) is newer than 550.163.01: not in its supported-GPU list, whose " in line
        assert line.endswith("use a newer driver branch")


def test_branch_that_dropped_the_gpu_names_the_legacy_branch():
    assert check("535.309.01", "proprietary", "10de:1180") == [
        "GeForce GTX 680 (PCI 10de:1180) is not supported by 535.309.01: NVIDIA moved it to the 470.xx "
        "legacy branch; use a 470 driver"
    ]


def test_a_gpu_missing_from_an_incomplete_list_is_noted_not_refused():
    notes: list[str] = []
    # NVIDIA's list omits the Tesla T4 although the same drivers run it (capture tesla-t4_515.105.01)
    assert check("550.163.01", "open", "10de:1eb8:10de:12a2", notes=notes) == []
    assert notes == ["NVIDIA device 10de:1eb8 (PCI 10de:1eb8) is not in the supported-GPU list of 550.163.01 "
                     "(NVIDIA's list is incomplete; not refused)"]


def test_bad_input_is_one_clear_error():
    with pytest.raises(InputError, match=r"^supported-gpus.json of 550.163.01: not NVIDIA's supported-gpus"):
        support.check_support('{"gpus": []}', "open", ["10de:2330"], driver_version="550.163.01")
    with pytest.raises(InputError, match="not an NVIDIA PCI id"):
        support.check_support(LISTS["550.163.01"], "open", ["8086:1234"])


def test_pci_ids_from_sysfs_skip_bridges_and_other_vendors(tmp_path):
    root = sysfs(tmp_path, "2330:10de:16c1", "1db6")
    assert support.node_pci_ids(root) == ["10de:2330:10de:16c1", "10de:1db6"]
    assert support.node_pci_ids(tmp_path / "nothing") == []


def version_root(root: Path, version: str, flavour: str) -> Path:
    vdir = Layout(root).version_dir(version)
    (vdir / "share").mkdir(parents=True)
    (vdir / support.SUPPORT_FILE).write_text(LISTS[version])
    (vdir / "modules" / "6.1.0-56-amd64").mkdir(parents=True)
    (vdir / "modules" / "6.1.0-56-amd64" / "manifest.json").write_text(f'{{"flavour": "{flavour}"}}')
    return vdir


def test_require_refuses_with_the_first_problem_and_lists_the_rest(tmp_path):
    root = sysfs(tmp_path / "root", "1db6", "15f8", "2330")
    vdir = version_root(root, "550.163.01", "open")
    with pytest.raises(InputError) as e:
        support.require(root, vdir, "550.163.01")
    assert str(e.value).startswith("Tesla V100-PCIE-32GB (PCI 10de:1db6) is not supported by the open kernel")
    assert e.value.hint and "10de:15f8" in e.value.hint and "2330" not in e.value.hint
    support.require(root, vdir, "550.163.01", "proprietary")  # the proprietary flavour is fine
    support.require(root, tmp_path / "no-list", "550.163.01")  # an older artifact: not checked


def test_doctor_reports_the_support_check(tmp_path):
    root = sysfs(tmp_path / "root", "2b85")
    version_root(root, "550.163.01", "proprietary")
    report = doctor.doctor(root, checks={"support"})
    assert report.checks == []  # nothing active: nothing to check
    layout = Layout(root)
    (layout.version_dir("550.163.01") / MANIFEST).write_text("{}")
    layout.current.symlink_to("550.163.01")  # the active version, as activate leaves it
    (c,) = doctor.doctor(root, checks={"support"}).checks
    assert not c.ok and "(PCI 10de:2b85) is newer than 550.163.01" in c.message


def test_the_list_is_read_from_the_user_space_artifact_without_extracting(tmp_path):
    from nodeprep.artifact import Manifest, pack, read_member

    payload = tmp_path / "payload"
    (payload / "share").mkdir(parents=True)
    (payload / support.SUPPORT_FILE).write_text(LISTS["535.309.01"])
    manifest = Manifest(kind="userspace", driver_version="535.309.01", arch="amd64", os="debian-12",
                        input_digest="1" * 64, inputs={})
    path, _ = pack(payload, manifest, tmp_path / "out")
    assert read_member(path, support.SUPPORT_FILE) == LISTS["535.309.01"].encode()
    assert read_member(path, "share/nothing.json") is None
    root = sysfs(tmp_path / "root", "15f8")
    support.require_artifact(root, path, "535.309.01", "proprietary")
    with pytest.raises(InputError, match=r"^Tesla P100-PCIE-16GB \(PCI 10de:15f8\) is not supported"):
        support.require_artifact(root, path, "535.309.01", "open")
    assert sorted(p.name for p in (tmp_path / "root").iterdir()) == ["sys"]  # nothing written
