#!/usr/bin/env python3
"""Benchmark `node_labels`: local facts (goal <= 100 ms) and the worst case, a cloud metadata service
that accepts connections and never answers (goal <= 1.5 s).

Everything runs against temp dirs and loopback servers started here: DMI is written to a temp dir and
every metadata endpoint points at 127.0.0.1, so nothing leaves the machine.

    python3 bench/labels.py [--runs N]
"""

from __future__ import annotations

import argparse
import logging
import socket
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchlib import Goals, run, use_venv  # noqa: E402  (bench/benchlib.py, next to this file)

use_venv()

from nodeprep.labels import pciids  # noqa: E402
from nodeprep.labels.cloud import Endpoints  # noqa: E402
from nodeprep.labels.core import LabelOptions, node_labels  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures" / "nvidia-smi"


def hgx_sysfs(root: Path) -> Path:
    sysfs = root / "sys"
    for i in range(8):
        d = sysfs / "bus/pci/devices" / f"0000:{0x18 + i * 16:02x}:00.0"
        d.mkdir(parents=True)
        for name, value in (("vendor", "0x10de"), ("device", "0x2330"), ("class", "0x030200")):
            (d / name).write_text(value + "\n")
    for i in range(4):
        d = sysfs / "bus/pci/devices" / f"0000:0{5 + i}:00.0"
        d.mkdir(parents=True)
        for name, value in (("vendor", "0x10de"), ("device", "0x22a3"), ("class", "0x068000")):
            (d / name).write_text(value + "\n")
    (sysfs / "module/nvidia").mkdir(parents=True)
    (sysfs / "module/nvidia/version").write_text("550.127.05\n")
    return sysfs


def dmi(root: Path, **fields: str) -> Path:
    d = root / "dmi"
    d.mkdir(parents=True, exist_ok=True)
    for k, v in fields.items():
        (d / k).write_text(v + "\n")
    return d


class Silent:
    """Accepts TCP connections on 127.0.0.1 and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.1)
        self.conns: list[socket.socket] = []
        self.stop = threading.Event()
        threading.Thread(target=self._loop, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                pass

    def close(self) -> None:
        self.stop.set()
        for c in self.conns:
            c.close()
        self.sock.close()


def aws_stub() -> ThreadingHTTPServer:
    class H(BaseHTTPRequestHandler):
        def _reply(self, body: str) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def do_PUT(self) -> None:
            self._reply("token")

        def do_GET(self) -> None:
            self._reply({"/latest/meta-data/instance-type": "p5.48xlarge",
                         "/latest/meta-data/placement/region": "us-east-1"}.get(self.path, "us-east-1a"))

        def log_message(self, *a: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return srv


def timed(opts: LabelOptions, runs: int) -> tuple[list[float], dict[str, str], list[str]]:
    times = []
    result = None
    for _ in range(runs):
        t = time.perf_counter()
        result = node_labels(opts)
        times.append(time.perf_counter() - t)
    assert result is not None
    return times, result.labels, result.warnings


def report(goals: Goals, name: str, times: list[float], goal: float) -> None:
    med, worst = statistics.median(times), max(times)
    verdict = goals.at_most(name, worst, goal)
    print(f"{name:<52} median {med * 1000:8.1f} ms  max {worst * 1000:8.1f} ms  goal <= {goal * 1000:6.0f} ms"
          f"  max/goal {worst / goal:5.2f}  {verdict}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    logging.getLogger("nodeprep").setLevel(logging.ERROR)  # warnings are expected in the worst case
    dead = Endpoints(aws="http://127.0.0.1:9", gce="http://127.0.0.1:9", azure="http://127.0.0.1:9")
    goals = Goals()
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        sysfs = hgx_sysfs(t)
        root = t / "root"
        (root / "etc").mkdir(parents=True)
        (root / "etc/os-release").write_text("ID=debian\nVERSION_ID=12\n")
        base = dict(root=root, sysfs_root=sysfs, endpoints=dead, use_nvml=False, run_nvidia_smi=False,
                    kernel="6.1.0-28-amd64")
        bare = dmi(t / "bm", sys_vendor="Dell Inc.", product_name="PowerEdge XE9680")

        pciids._load.cache_clear()
        t0 = time.perf_counter()
        db = pciids.nvidia_devices()
        cold = time.perf_counter() - t0
        print(f"pci.ids ({pciids.find_pci_ids()}): {len(db)} NVIDIA devices parsed in "
              f"{cold * 1000:.1f} ms (cold)")
        pciids._load.cache_clear()
        first, _, _ = timed(LabelOptions(**base, dmi_root=bare), 1)
        report(goals, "local facts, PCI sysfs (first run: pci.ids parsed)", first, 0.100)
        times, labels, _ = timed(LabelOptions(**base, dmi_root=bare), args.runs)
        report(goals, "local facts, PCI sysfs (HGX H100, bare metal DMI)", times, 0.100)
        assert labels["nvidia.com/gpu.count"] == "8", labels
        xml = FIXTURES / "dual-rtx-a5000_590.44.01.xml"
        if xml.is_file():
            times, labels, _ = timed(LabelOptions(**base, dmi_root=bare, nvidia_smi_xml=xml), args.runs)
            report(goals, "local facts, nvidia-smi XML (dual A5000, 94 KB)", times, 0.100)

        srv = aws_stub()
        aws_dmi = dmi(t / "aws", sys_vendor="Amazon EC2", product_name="p5.48xlarge")
        eps = Endpoints(aws=f"http://127.0.0.1:{srv.server_address[1]}", gce=dead.gce, azure=dead.azure)
        times, labels, warnings = timed(LabelOptions(**{**base, "endpoints": eps}, dmi_root=aws_dmi),
                                        args.runs)
        report(goals, "AWS metadata answering (loopback stub)", times, 0.100)
        assert labels["topology.kubernetes.io/zone"] == "us-east-1a" and not warnings, (labels, warnings)
        srv.shutdown()
        srv.server_close()

        silent = Silent()
        eps = Endpoints(aws=silent.url, gce=dead.gce, azure=dead.azure)
        runs = max(3, args.runs // 5)
        times, labels, warnings = timed(LabelOptions(**{**base, "endpoints": eps}, dmi_root=aws_dmi), runs)
        report(goals, "worst case: metadata never answers (DMI fallback)", times, 1.5)
        assert labels["node.kubernetes.io/instance-type"] == "p5.48xlarge" and warnings
        silent.close()
    return goals.exit_code()


if __name__ == "__main__":
    run(main)
