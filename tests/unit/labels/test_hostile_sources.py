"""Fact sources that try to hang or crash the labeler (issue 18 §3).

Metadata services are stood in for by raw loopback TCP servers that misbehave on purpose: accept and
never answer, drip the headers or the body a byte at a time, or send 5 MB. sysfs and DMI are real
files in a temporary tree: random bytes, a FIFO (mkfifo), a symlink and an oversized file. Nothing
here asserts on elapsed time: the outcome (the warning naming the failed source, the fallback
labels, the server seeing the client hang up) is checked; thread joins and subprocess timeouts are
generous hang guards only.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nodeprep import sysfs
from nodeprep.labels import cloud as cloudmod
from nodeprep.labels.core import LabelOptions, LabelResult, node_labels
from nodeprep.labels.gpu import sysfs_driver_version
from nodeprep.node.doctor import loaded_version

from .conftest import add_pci, write_dmi

HANG_GUARD = 60.0  # seconds; far above the 1.5 s budget, only so a regression fails instead of hanging

AWS_DMI = dict(sys_vendor="Amazon EC2", product_name="g5.xlarge")


class Hostile:
    """A loopback TCP server; `mode` decides how it mistreats each connection. `hung_up` is set when
    the client closed the connection (recv returned b"" or a send failed)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        self.hung_up = threading.Event()
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.sock.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(HANG_GUARD)
            conn.recv(65536)  # the request
            if self.mode == "silent":
                while conn.recv(65536):
                    pass
            elif self.mode == "drip-headers":
                head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n" + b"X-Pad: " + b"a" * 100000
                for i in range(len(head)):
                    conn.sendall(head[i:i + 1])
                    self.stop.wait(0.02)
            elif self.mode == "drip-body":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
                for _ in range(1000):
                    conn.sendall(b"x")
                    self.stop.wait(0.02)
            elif self.mode == "huge":
                body = b"p4d.24xlarge" * (5_000_000 // 12)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                conn.recv(1)
            elif self.mode == "huge-chunked":
                conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                chunk = b"x" * 65536
                for _ in range(80):  # 5 MB
                    conn.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
                conn.sendall(b"0\r\n\r\n")
                conn.recv(1)
        except OSError:
            pass
        finally:
            self.hung_up.set()
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture
def hostile() -> Iterator[Callable[[str], Hostile]]:
    servers: list[Hostile] = []

    def start(mode: str) -> Hostile:
        servers.append(Hostile(mode))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def _labels_returning(opts: LabelOptions) -> LabelResult:
    box: dict[str, LabelResult] = {}
    t = threading.Thread(target=lambda: box.setdefault("r", node_labels(opts)), daemon=True)
    t.start()
    t.join(HANG_GUARD)
    assert not t.is_alive(), "node_labels did not return"
    return box["r"]


@pytest.mark.parametrize("mode, why", [
    ("silent", "no complete answer within the 1s budget"),
    ("drip-headers", "no complete answer within the 1s budget"),
    ("drip-body", "no complete answer within the 1s budget"),
    ("huge", "answer of 4999992 bytes (more than 65536); refused"),
    ("huge-chunked", "answer larger than 65536 bytes; refused"),
])
def test_hostile_metadata_service_is_cut_off(hostile: Callable[[str], Hostile], tmp_path: Path,
                                            options: Callable[..., LabelOptions], mode: str,
                                            why: str) -> None:
    """One deadline covers connect and every read of all metadata requests, and answers are capped:
    the labels fall back to DMI, the warning names the service and why, and the client itself hangs
    up on the server (no worker left reading a drip after `labels` returned)."""
    srv = hostile(mode)
    dmi = write_dmi(tmp_path / "aws", **AWS_DMI)
    result = _labels_returning(options(dmi_root=dmi, endpoints=cloudmod.Endpoints(
        aws=srv.url, gce="http://127.0.0.1:9", azure="http://127.0.0.1:9")))
    assert result.sources["cloud"] == "dmi"
    assert result.labels["node.kubernetes.io/instance-type"] == "g5.xlarge"
    assert "topology.kubernetes.io/zone" not in result.labels
    assert [w for w in result.warnings if w.startswith("cloud:")] == [
        f"cloud: aws metadata at {srv.url} failed ({why}); falling back to DMI"]
    assert srv.connections >= 1
    assert srv.hung_up.wait(HANG_GUARD), "the metadata client kept the connection open"


# --- sysfs, DMI ------------------------------------------------------------------------------------

def test_read_attr_reads_only_small_regular_files(tmp_path: Path) -> None:
    (tmp_path / "ok").write_text("0x10de\n")
    (tmp_path / "bin").write_bytes(b"\xff\xfe\x00garbage")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "big").write_bytes(b"x" * (sysfs.MAX_ATTR + 1))
    os.symlink("ok", tmp_path / "link")
    problems: list[str] = []
    assert sysfs.read_attr(tmp_path / "ok", problems) == "0x10de\n"
    assert sysfs.read_attr(tmp_path / "missing", problems) is None
    for name in ("bin", "fifo", "big", "link"):
        assert sysfs.read_attr(tmp_path / name, problems) is None
    assert problems == [
        f"{tmp_path}/bin: not text (byte 0xff at offset 0 is not UTF-8); ignored",
        f"{tmp_path}/fifo: not a regular file (a FIFO); ignored",
        f"{tmp_path}/big: larger than {sysfs.MAX_ATTR} bytes; ignored",
        f"{tmp_path}/link: is a symbolic link; ignored",
    ]
    assert sysfs.read_attr(tmp_path / "link", follow=True) == "0x10de\n"


def test_random_driver_version_is_a_fact_source_failure(tmp_path: Path) -> None:
    sys_root = tmp_path / "sys"
    (sys_root / "module" / "nvidia").mkdir(parents=True)
    (sys_root / "module" / "nvidia" / "version").write_bytes(random.Random(18).randbytes(64) + b"\xff")
    problems: list[str] = []
    assert sysfs_driver_version(sys_root, problems) is None
    assert len(problems) == 1 and "module/nvidia/version: not text" in problems[0]
    # doctor reads the same file through the same helper: no UnicodeDecodeError there either
    (tmp_path / "sys").rename(tmp_path / "sys2")
    (tmp_path / "root").mkdir()
    (tmp_path / "sys2").rename(tmp_path / "root" / "sys")
    assert loaded_version(tmp_path / "root") is None


def _hostile_tree(tmp_path: Path) -> tuple[Path, Path, Path]:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "os-release").write_text('ID=debian\nVERSION_ID="12"\n')
    sys_root = tmp_path / "sys"
    add_pci(sys_root, "0000:01:00.0", 0x10DE, 0x20B0, 0x030200)
    (sys_root / "module" / "nvidia").mkdir(parents=True)
    (sys_root / "module" / "nvidia" / "version").write_bytes(random.Random(14).randbytes(200) + b"\xff")
    dmi = write_dmi(tmp_path / "dmi", sys_vendor="Dell Inc.")
    os.mkfifo(dmi / "product_name")  # nothing ever writes to it: a blocking open would wait forever
    (tmp_path / "elsewhere").write_text("1.0\n")
    os.symlink(tmp_path / "elsewhere", dmi / "bios_version")
    (dmi / "board_asset_tag").write_bytes(b"x" * (1 << 20))
    return root, sys_root, dmi


def test_hostile_sysfs_and_dmi_through_the_cli(tmp_path: Path) -> None:
    """`nodeprep labels` on a tree with random bytes in the module version, a FIFO, a symlink and a
    1 MiB file among the DMI attributes: exit 0, labels from what is sane, one warning line per bad
    file, no traceback. A subprocess, so a hang is killed by its timeout rather than the suite."""
    root, sys_root, dmi = _hostile_tree(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "nodeprep.cli", "labels", "--root", str(root), "--sysfs-root", str(sys_root),
         "--dmi-root", str(dmi), "--cloud", "none", "--json"],
        capture_output=True, text=True, timeout=HANG_GUARD,
        env={**os.environ, "PATH": "/usr/bin:/bin", "NODEPREP_PCI_IDS": str(tmp_path / "none")},
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    data = json.loads(proc.stdout)
    assert data["labels"]["nvidia.com/gpu.present"] == "true"
    assert data["labels"]["nvidia.com/gpu.machine"] == "unknown"  # product_name (the FIFO) skipped
    assert not any(k.startswith("nvidia.com/cuda.driver") for k in data["labels"])
    warnings = data["warnings"]
    assert f"dmi: {dmi}/product_name: not a regular file (a FIFO); ignored" in warnings
    assert f"dmi: {dmi}/bios_version: is a symbolic link; ignored" in warnings
    assert f"dmi: {dmi}/board_asset_tag: larger than {sysfs.MAX_ATTR} bytes; ignored" in warnings
    assert any(w.startswith(f"gpu: {sys_root}/module/nvidia/version: not text") for w in warnings)
    assert all("\n" not in w for w in warnings)
    assert data["facts"]["dmi"] == {"sys_vendor": "Dell Inc."}
