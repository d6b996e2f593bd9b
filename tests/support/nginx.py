"""Debian's nginx serving a directory on loopback, for tests and bench (never the packaged service).

`start_nginx(work, root)` writes a config under `work` (sendfile, its own pid and temp paths) and
runs nginx in the foreground on a free 127.0.0.1 port. With `access_log=True` every request is
logged to `work/access.log` as `METHOD URI STATUS BYTES range=RANGE auth=yes|no`: whether an
Authorization header came (never its value). `Nginx.stop()` ends it; use it as a context manager.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import procs

from .registry import free_port


@dataclass(frozen=True)
class Hit:
    method: str
    uri: str
    status: int
    size: int
    range: str
    auth: bool


@dataclass
class Nginx:
    work: Path
    port: int
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def hits(self, settle: float = 0.3) -> list[Hit]:
        """The access log, parsed (empty without access_log=True), once it has not grown for
        `settle` seconds (nginx logs a request after its response is sent)."""
        log = self.work / "access.log"
        size, end = -1, time.monotonic() + 10
        while time.monotonic() < end:
            now = log.stat().st_size if log.exists() else 0
            if now == size:
                break
            size = now
            time.sleep(settle)
        out = []
        for line in log.read_text().splitlines() if log.exists() else []:
            method, uri, status, size, rng, auth = line.split(" ")
            out.append(Hit(method, uri, int(status), int(size), rng.removeprefix("range="),
                           auth == "auth=yes"))
        return out

    def stop(self) -> None:
        procs.stop(self.proc)
        self.proc = None

    def __enter__(self) -> Nginx:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def nginx_conf(work: Path, root: Path, port: int, *, access_log: bool = False) -> Path:
    for d in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (work / d).mkdir(parents=True, exist_ok=True)
    log = (f"log_format hits '$request_method $uri $status $body_bytes_sent range=$http_range "
           f"auth=$has_auth';\n    access_log {work}/access.log hits;") if access_log else "access_log off;"
    conf = work / "nginx.conf"
    # workers as root when run as root: pytest's and mkdtemp's directories are 0700
    user = "user root;" if os.geteuid() == 0 else ""
    conf.write_text(f"""
daemon off;
{user}
worker_processes 2;
pid {work}/nginx.pid;
error_log {work}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    map $http_authorization $has_auth {{ "" no; default yes; }}
    {log}
    sendfile on;
    tcp_nopush on;
    keepalive_timeout 30;
    client_body_temp_path {work}/client_body;
    proxy_temp_path {work}/proxy;
    fastcgi_temp_path {work}/fastcgi;
    uwsgi_temp_path {work}/uwsgi;
    scgi_temp_path {work}/scgi;
    types {{ application/json json; }}
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        location / {{ }}
    }}
}}
""")
    return conf


def start_nginx(work: Path, root: Path, *, access_log: bool = False, timeout: float = 10) -> Nginx:
    """A started nginx serving `root`; see the module docstring."""
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(binary).exists():
        raise RuntimeError("nginx is missing (scripts/deps/node.apt)")
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    conf = nginx_conf(work, root, port, access_log=access_log)
    proc = subprocess.Popen([binary, "-c", str(conf), "-e", str(work / "error.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    server = Nginx(work=work, port=port, proc=proc)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            break
        try:
            urllib.request.urlopen(server.url + "/", timeout=1).read()
            return server
        except urllib.error.HTTPError:
            return server  # it answers (403/404 for the directory itself)
        except OSError:
            time.sleep(0.1)
    server.stop()
    log = work / "error.log"
    raise RuntimeError(f"nginx did not start: {log.read_text()[-1000:] if log.exists() else ''}")
