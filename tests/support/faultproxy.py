"""A misbehaving store on loopback: serves a directory (with Range) or forwards to an upstream
(e.g. the test registry over TLS), and on the way cuts connections after N body bytes, stalls,
answers 5xx in bursts, goes down for good after N bytes, or redirects. It counts the body bytes it served
per path, so a test can tell a resumed download (only the rest is fetched) from a restart.

Faults apply to requests whose path contains `Faults.match` (default: every GET).
"""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import threading
from collections import defaultdict
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

BLOCK = 16384


@dataclass
class Faults:
    match: str = ""
    cut_after: int | None = None  # close each matching response after this many body bytes
    cuts: int = 1_000_000  # ... for this many responses, then serve normally
    stall_after: int | None = None  # stop sending (connection kept open) after this many bytes
    stalls: int = 1_000_000
    fail_burst: int = 0  # answer this many matching requests with `fail_status` first
    fail_status: int = 503
    down_after: int | None = None  # after this many matching body bytes: cut, then refuse everything
    ignore_range: bool = False  # directory mode: answer 200 with the whole file to a Range request
    extra_bytes: int = 0  # directory mode: send this many junk bytes past the end of the file
    authorization: str | None = None  # directory mode: answer 401 unless this Authorization is sent
    redirect: str | None = None  # answer matching requests (HEAD too) with a 307 to this base URL + path
    redirect_status: int = 307


@dataclass
class Seen:
    method: str
    path: str
    range: str | None
    status: int


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    proxy: FaultProxy

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that gives up mid-response is what these tests do on purpose


class FaultProxy:
    def __init__(self, *, directory: Path | None = None, upstream: str | None = None,
                 cafile: Path | None = None) -> None:
        assert (directory is None) != (upstream is None)
        self.directory = directory
        self.upstream = urlsplit(upstream) if upstream else None
        self.ssl = ssl.create_default_context(cafile=str(cafile)) if cafile else None
        self.faults = Faults()
        self.lock = threading.Lock()
        self.served: dict[str, int] = defaultdict(int)
        self.total = 0
        self.seen: list[Seen] = []
        self.down = False
        self.release = threading.Event()
        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.server.proxy = self
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def reset(self, faults: Faults | None = None) -> None:
        with self.lock:
            self.faults = faults or Faults()
            self.served.clear()
            self.total = 0
            self.seen.clear()
            self.down = False

    def served_for(self, fragment: str) -> int:
        return sum(n for p, n in self.served.items() if fragment in p)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._handle(head=True)

    def do_GET(self) -> None:
        self._handle(head=False)

    def _handle(self, *, head: bool) -> None:
        proxy = self.server.proxy
        with proxy.lock:
            f = proxy.faults
            matching = f.match in self.path and not head
            if proxy.down:
                self._drop()
                return
            fail = matching and f.fail_burst > 0
            if fail:
                f.fail_burst -= 1
            cut = f.cut_after if matching and f.cut_after is not None and f.cuts > 0 else None
            if cut is not None:
                f.cuts -= 1
            stall = f.stall_after if matching and f.stall_after is not None and f.stalls > 0 else None
            if stall is not None:
                f.stalls -= 1
        rng = self.headers.get("Range")
        if f.redirect is not None and f.match in self.path:
            self._record(rng, f.redirect_status)
            self.send_response(f.redirect_status)
            self.send_header("Location", f.redirect + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if f.authorization is not None and self.headers.get("Authorization") != f.authorization:
            fail, f = True, Faults(fail_status=401)
        if fail:
            self._record(rng, f.fail_status)
            body = b"try later\n"
            self.send_response(f.fail_status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if proxy.directory is not None:
            status, headers, chunks = self._from_directory(rng, f)
        else:
            status, headers, chunks = self._from_upstream(head)
        self._record(rng, status)
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        if head:
            return
        self._counted = 0
        with proxy.lock:
            budget = None if not matching or f.down_after is None else \
                max(0, f.down_after - sum(n for q, n in proxy.served.items() if f.match in q))
        bounds = [x for x in (cut, stall, budget) if x is not None]
        limit = min(bounds) if bounds else None
        sent = 0
        for chunk in chunks:
            for i in range(0, len(chunk), BLOCK):
                piece = chunk[i:i + BLOCK]
                if limit is not None and sent + len(piece) >= limit:
                    piece = piece[: max(0, limit - sent)]
                    self._write(piece)
                    sent += len(piece)
                    self._count(sent)
                    if limit == budget:
                        proxy.down = True
                    elif limit == stall:
                        proxy.release.wait(60)
                    self._drop()
                    return
                self._write(piece)
                sent += len(piece)
        self._count(sent)

    def _count(self, sent: int) -> None:
        proxy = self.server.proxy
        with proxy.lock:
            proxy.served[self.path] += sent - getattr(self, "_counted", 0)
            proxy.total += sent - getattr(self, "_counted", 0)
            self._counted = sent

    def _write(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _record(self, rng: str | None, status: int) -> None:
        proxy = self.server.proxy
        with proxy.lock:
            proxy.seen.append(Seen(self.command, self.path, rng, status))

    def _from_directory(self, rng: str | None, f: Faults):  # type: ignore[no-untyped-def]
        proxy = self.server.proxy
        assert proxy.directory is not None
        path = proxy.directory / self.path.lstrip("/").split("?")[0]
        if not path.is_file() or ".." in self.path:
            return 404, [("Content-Length", "0")], [b""]
        size = path.stat().st_size
        start = 0
        status = 200
        headers: list[tuple[str, str]] = []
        if rng and rng.startswith("bytes=") and not f.ignore_range:
            a = int(rng[6:].split("-")[0])
            if a >= size:
                return 416, [("Content-Range", f"bytes */{size}"), ("Content-Length", "0")], [b""]
            start, status = a, 206
            headers.append(("Content-Range", f"bytes {a}-{size - 1}/{size}"))
        headers.append(("Content-Length", str(size - start + f.extra_bytes)))
        headers.append(("Accept-Ranges", "bytes"))

        def chunks():  # type: ignore[no-untyped-def]
            with open(path, "rb") as fh:
                fh.seek(start)
                yield from iter(lambda: fh.read(1 << 20), b"")
            if f.extra_bytes:
                yield os.urandom(f.extra_bytes)

        return status, headers, chunks()

    def _from_upstream(self, head: bool):  # type: ignore[no-untyped-def]
        proxy = self.server.proxy
        up = proxy.upstream
        assert up is not None
        conn: http.client.HTTPConnection
        if up.scheme == "https":
            conn = http.client.HTTPSConnection(up.hostname or "", up.port, context=proxy.ssl, timeout=30)
        else:
            conn = http.client.HTTPConnection(up.hostname or "", up.port, timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        conn.request(self.command, self.path, headers=headers)
        resp = conn.getresponse()
        out = [(k, v) for k, v in resp.getheaders()
               if k.lower() not in ("connection", "transfer-encoding", "keep-alive")]
        if head:
            conn.close()
            return resp.status, out, [b""]
        body = resp.read()
        conn.close()
        out = [(k, v) for k, v in out if k.lower() != "content-length"]
        out.append(("Content-Length", str(len(body))))
        return resp.status, out, [body]
