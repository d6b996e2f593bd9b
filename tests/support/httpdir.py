"""Loopback HTTP servers: one directory (the stores, runfiles and wheels tests download), or any
request handler a test writes."""

from __future__ import annotations

import contextlib
import functools
import http.server
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@contextlib.contextmanager
def serve_directory(directory: Path, *, tls: tuple[Path, Path] | None = None) -> Iterator[str]:
    """Serves `directory` on 127.0.0.1 (an ephemeral port) until the block ends; yields the base URL
    (no trailing slash). With `tls` = (certificate, key), e.g. from tests.support.registry.make_ca,
    over https. The server is shut down and its thread joined, also on failure."""
    with serve(functools.partial(_Quiet, directory=str(directory)), tls=tls) as url:
        yield url


@contextlib.contextmanager
def serve(handler: Any, *, tls: tuple[Path, Path] | None = None,
          daemon_threads: bool = False) -> Iterator[str]:
    """Serves requests with `handler` (a BaseHTTPRequestHandler class or factory) on 127.0.0.1 until
    the block ends; yields the base URL. Shut down and its thread joined, also on failure."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = daemon_threads
    if tls is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(tls[0]), str(tls[1]))
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
