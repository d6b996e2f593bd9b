"""Fixtures for the labels tests.

Network guard: every test here runs with socket connects and name lookups restricted to loopback, so
no code path can reach 169.254.169.254, metadata.google.internal or anything else. Cloud metadata
services and the Kubernetes API are stood in for by http.server instances on 127.0.0.1.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from nodeprep import runner
from nodeprep.labels import cloud as cloudmod
from nodeprep.labels.core import LabelOptions

LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


def _is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refuse (and fail loudly on) any connection or DNS lookup that is not loopback."""
    real_connect = socket.socket.connect
    real_getaddrinfo = socket.getaddrinfo

    def connect(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(str(address[0])):
            raise AssertionError(f"test tried to connect to non-loopback {address!r}")
        return real_connect(self, address)

    def getaddrinfo(host: Any, *args: Any, **kw: Any) -> Any:
        if host is not None and not _is_loopback(str(host)):
            raise AssertionError(f"test tried to resolve non-loopback host {host!r}")
        return real_getaddrinfo(host, *args, **kw)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    for env in cloudmod.ENDPOINT_ENV.values():
        monkeypatch.delenv(env, raising=False)


# --- fake /sys trees --------------------------------------------------------------------------------

def add_pci(sysfs: Path, bus_id: str, vendor: int, device: int, cls: int, subsys: int = 0) -> Path:
    d = sysfs / "bus" / "pci" / "devices" / bus_id
    d.mkdir(parents=True)
    (d / "vendor").write_text(f"0x{vendor:04x}\n")
    (d / "device").write_text(f"0x{device:04x}\n")
    (d / "class").write_text(f"0x{cls:06x}\n")
    (d / "subsystem_vendor").write_text(f"0x{vendor:04x}\n")
    (d / "subsystem_device").write_text(f"0x{subsys:04x}\n")
    (d / "config").write_bytes(pci_config(vendor, device, cls))
    return d


def pci_config(vendor: int, device: int, cls: int, capability: bytes = b"") -> bytes:
    """A 256-byte PCI configuration space as root reads it from sysfs; with `capability`, a
    capability list whose one entry (at 0x40) is those bytes."""
    config = bytearray(256)
    config[0:4] = vendor.to_bytes(2, "little") + device.to_bytes(2, "little")
    config[9:12] = cls.to_bytes(3, "little")
    if capability:
        config[0x06] = 0x10  # status: capability list
        config[0x34] = 0x40
        config[0x40:0x40 + len(capability)] = capability
    return bytes(config)


def write_dmi(dmi: Path, **fields: str) -> Path:
    dmi.mkdir(parents=True, exist_ok=True)
    for k, v in fields.items():
        (dmi / k).write_text(v + "\n")
    return dmi


@pytest.fixture
def empty_sysfs(tmp_path: Path) -> Path:
    d = tmp_path / "sys"
    (d / "bus" / "pci" / "devices").mkdir(parents=True)
    return d


@pytest.fixture
def empty_root(tmp_path: Path) -> Path:
    d = tmp_path / "root"
    (d / "etc").mkdir(parents=True)
    (d / "etc" / "os-release").write_text('ID=debian\nVERSION_ID="12"\n')
    return d


@pytest.fixture
def options(empty_sysfs: Path, empty_root: Path, tmp_path: Path) -> Callable[..., LabelOptions]:
    """LabelOptions with every input in temporary directories and endpoints that must never be used
    (port 9 on loopback: discard, nothing listens)."""
    dead = cloudmod.Endpoints(aws="http://127.0.0.1:9", gce="http://127.0.0.1:9", azure="http://127.0.0.1:9")
    dmi = tmp_path / "dmi"
    dmi.mkdir()

    def make(**kw: Any) -> LabelOptions:
        base: dict[str, Any] = dict(root=empty_root, sysfs_root=empty_sysfs, dmi_root=dmi, endpoints=dead,
                                    kernel="6.1.0-28-amd64", use_nvml=False, run_nvidia_smi=False)
        base.update(kw)
        return LabelOptions(**base)

    return make


# --- loopback HTTP stand-ins -------------------------------------------------------------------------

@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Server:
    url: str
    requests: list[Recorded] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)


Handler = Callable[[Server, Recorded], tuple[int, dict[str, str], bytes | str]]


@pytest.fixture
def http_server() -> Iterator[Callable[[Handler], Server]]:
    """Start loopback HTTP servers (127.0.0.1, ephemeral port) answering with `handler`."""
    servers: list[ThreadingHTTPServer] = []

    def start(handler: Handler) -> Server:
        srv_info = Server(url="")

        class H(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                rec = Recorded(self.command, self.path, {k.lower(): v for k, v in self.headers.items()},
                               self.rfile.read(length) if length else b"")
                srv_info.requests.append(rec)
                status, headers, body = handler(srv_info, rec)
                data = body.encode() if isinstance(body, str) else body
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = do_PATCH = do_POST = _serve

            def log_message(self, *args: Any) -> None:
                pass

        srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(srv)
        srv_info.url = f"http://127.0.0.1:{srv.server_address[1]}"
        return srv_info

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A loopback TCP server that accepts connections and never answers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def loop() -> None:
        sock.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
                accepted.append(conn)
            except OSError:
                continue

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    stop.set()
    t.join(2)
    for c in accepted:
        c.close()
    sock.close()


def json_body(obj: Any) -> tuple[int, dict[str, str], str]:
    return 200, {"Content-Type": "application/json"}, json.dumps(obj)


@pytest.fixture
def no_host_nvidia_smi() -> None:
    """The nvidia-smi tests need this host to have none of its own on PATH."""
    if runner.which("nvidia-smi"):
        pytest.skip("a real nvidia-smi is on PATH here")


def stand_in(root: Path, body: str) -> Path:
    """A driver root under `root` (/opt/nvidia/current -> 535.54.03) whose bin/nvidia-smi runs `body`."""
    bindir = root / "opt/nvidia/535.54.03/bin"
    bindir.mkdir(parents=True)
    tool = bindir / "nvidia-smi"
    tool.write_text("#!/bin/sh\n" + body + "\n")
    tool.chmod(0o755)
    os.symlink("535.54.03", root / "opt/nvidia/current")
    return tool
