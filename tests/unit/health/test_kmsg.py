"""The kernel's NVRM Xid lines (nodeprep.health.kmsg): recorded lines from public reports
(tests/fixtures/kmsg, no GPU, no NVML), /dev/kmsg's record format, and hostile input."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from nodeprep.health.catalog import action_of, catalog
from nodeprep.health.kmsg import MAX_TEXT, KernelXid, KmsgReader, parse_record, parse_xid, pci_key

REPO = Path(__file__).resolve().parents[3]
CAPTURE = REPO / "tests/fixtures/kmsg/nvrm-xid.dmesg"


def test_recorded_lines_give_code_address_and_time() -> None:
    found = [x for x in map(parse_record, CAPTURE.read_text().splitlines()) if x is not None]
    assert [(x.code, x.pci) for x in found] == [
        (79, "0000:03:00"), (3, "0000:01:00"), (63, "0000:10:1c"), (119, "0000:65:00"), (120, "0000:01:00"),
        (154, "0000:01:00"), (62, "0000:01:00"), (45, "0000:01:00"), (41, "0000:06:00")]
    assert found[0] == KernelXid(79, "0000:03:00", "GPU has fallen off the bus.)", 5107644336)
    assert found[2].text.startswith("pid=1896, Row Remapper: New row marked for remapping")


def test_kmsg_records() -> None:
    x = parse_record("3,1234,917297993,-;NVRM: Xid (PCI:0000:1a:00): 79, pid=2211, name=python3, "
                     "GPU has fallen off the bus.\n SUBSYSTEM=pci\n DEVICE=+pci:0000:1a:00.0")
    assert x == KernelXid(79, "0000:1a:00", "pid=2211, name=python3, GPU has fallen off the bus.",
                          917297993)
    assert parse_record("6,99,1,-;nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver") is None
    assert parse_record("6,99,1,c;NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae") \
        is None


def test_xid_154_action_is_the_one_the_line_names() -> None:
    assert action_of(154, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)") \
        == "reset"
    assert action_of(154, "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x2 (Node Reboot "
                          "Required)") == "reboot"
    assert action_of(154, "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)") \
        == "ignore"
    assert action_of(154) == "reset"


def test_pci_spellings_meet() -> None:
    assert pci_key("00000000:1A:00.0") == pci_key("0000:1a:00") == "0000:1a:00"
    assert pci_key("0001:3B:00.1") == "0001:3b:00"
    assert pci_key("../../etc") is None and pci_key("0000:1a") is None


def test_hostile_lines_are_bounded_and_printable() -> None:
    long = "NVRM: Xid (PCI:0000:1a:00): 48, " + "\x1b[31m" + "A" * 100000
    x = parse_xid(long)
    assert x is not None and x.code == 48 and len(x.text) == MAX_TEXT and "\x1b" not in x.text
    for bad in ("NVRM: Xid (PCI:0000:1a:00): 999999, too big", "NVRM: Xid (PCI:zzzz:1a:00): 79, x",
                "NVRM: Xid (PCI:0000:1a:00) 79", "NVRM: Xid (PCI:0000:1a:00): -1, x", ""):
        assert parse_xid(bad) is None, bad


@given(st.text(max_size=3000))
def test_any_text_parses_or_is_none(text: str) -> None:
    x = parse_record(text)
    assert x is None or (0 <= x.code < 100000 and len(x.text) <= MAX_TEXT and x.text.isprintable())


def test_reader_of_a_growing_file(tmp_path: Path) -> None:
    """A plain file of records (a capture) is read as lines as it grows; a partial line waits."""
    path = tmp_path / "kmsg"
    path.write_text("6,1,5,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n"
                    "3,2,6,-;NVRM: Xid (PCI:0000:4b:00): 7")
    reader = KmsgReader(path)
    assert reader.read() == []
    with path.open("a") as f:
        f.write("9, pid=1, GPU has fallen off the bus.\n")
    assert [(x.code, x.pci) for x in reader.read()] == [(79, "0000:4b:00")]
    assert reader.read() == []
    reader.close()


def test_reader_of_a_fifo(tmp_path: Path) -> None:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    reader = KmsgReader(path)
    fd = os.open(path, os.O_WRONLY)
    os.write(fd, b"3,2,6,-;NVRM: Xid (PCI:0000:4b:00): 95, pid=1, Uncontained: FBHUB. RST: Yes, D-RST: No\n")
    assert [x.code for x in reader.read()] == [95]
    os.close(fd)
    reader.close()


def test_catalog_rows_name_their_source_and_actions() -> None:
    c = catalog()
    assert "docs.nvidia.com/deploy/xid-errors" in c.source
    assert {c.lookup(x).action for x in (13, 31, 43, 45)} == {"ignore"}
    assert c.lookup(79).action == "reboot" and c.lookup(79).bucket == "RESTART_BM"
    assert {c.lookup(x).action for x in (48, 64, 74, 95, 109, 119, 120)} == {"reset"}
    # the catalog's immediate action for a remapping event is IGNORE: the pending remap is NVML's to say
    assert c.lookup(63).action == "ignore" and c.lookup(61).mnemonic == "UNKNOWN"
    assert c.lookup(4242).mnemonic == "UNKNOWN" and c.lookup(4242).action == "reset"
