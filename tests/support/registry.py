"""A real CNCF distribution registry (Debian's `docker-registry`) on loopback for tests and bench.

`start_registry(work)` makes a test CA and a server certificate for 127.0.0.1 (openssl), a bcrypt
htpasswd file, a config with filesystem storage under `work`, and runs the registry binary on a
free loopback port (never the packaged service). `Registry.stop()` ends it; use it as a context
manager so a failing test still tears it down. `start_redirecting_registry(work)` adds an nginx
that serves the blob bytes behind the registry's redirects (the set-up of registries that serve
fleets: the registry answers a blob GET with a redirect to object storage or a file server).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tests.support import procs

if TYPE_CHECKING:
    from .nginx import Nginx

USER = "nodeprep-ci"
PASSWORD = "s3cret-registry-pass"  # a test credential for a loopback registry the test creates


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_ca(work: Path, host_ip: str = "127.0.0.1") -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key) for `host_ip`, made with openssl."""
    work.mkdir(parents=True, exist_ok=True)
    ca_key, ca_crt = work / "ca.key", work / "ca.crt"
    key, csr, crt, ext = work / "server.key", work / "server.csr", work / "server.crt", work / "ext.cnf"

    def ossl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca_crt),
         "-days", "2", "-subj", "/CN=nodeprep test CA")
    ossl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
         "-subj", f"/CN={host_ip}")
    ext.write_text(f"subjectAltName=IP:{host_ip}\nbasicConstraints=CA:FALSE\n"
                   "extendedKeyUsage=serverAuth\n")
    ossl("x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key),
         "-CAcreateserial", "-out", str(crt), "-days", "2", "-extfile", str(ext))
    return ca_crt, crt, key


def htpasswd_line(user: str, password: str) -> str:
    import bcrypt

    return f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=5, prefix=b'2a')).decode()}\n"


def write_auth_file(path: Path, host: str, user: str = USER, password: str = PASSWORD) -> Path:
    """A docker-style config.json (mode 0600) with credentials for `host`."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"auths": {host: {"auth": token}}}, f)
    return path


@dataclass
class Registry:
    work: Path
    port: int
    ca: Path
    storage: Path
    config: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, repo: str) -> str:
        return f"oci://{self.host}/{repo}"

    def start(self, timeout: float = 30) -> None:
        binary = shutil.which("docker-registry")
        if binary is None:
            raise RuntimeError("docker-registry is missing (scripts/deps/node.apt)")
        log = open(self.work / "registry.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen([binary, "serve", str(self.config)], stdout=log, stderr=log,
                                     stdin=subprocess.DEVNULL)
        ctx = ssl.create_default_context(cafile=str(self.ca))
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"registry exited: {(self.work / 'registry.log').read_text()[-2000:]}")
            try:
                urllib.request.urlopen(f"https://{self.host}/v2/", context=ctx, timeout=2)
            except urllib.error.HTTPError as e:
                if e.code == 401:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("registry did not come up")

    def stop(self) -> None:
        procs.stop(self.proc)
        self.proc = None

    def blob_data(self, digest: str) -> Path:
        """The file the registry keeps blob `digest` in (filesystem driver layout)."""
        hexd = digest.split(":", 1)[1]
        return (self.storage / "docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data")

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_registry(work: Path, *, auth: dict[str, object] | None = None,
                   tls: tuple[Path, Path, Path] | None = None, redirect: str | None = None) -> Registry:
    """A started registry with TLS (test CA, or `tls` = (ca, cert, key)) and htpasswd auth, or the
    `auth` section given (e.g. a token service's); see the module docstring. With `redirect` (a
    base URL), the storage middleware `redirect` answers every blob GET/HEAD with a 307 to
    `redirect` + the blob's path under the storage root."""
    work.mkdir(parents=True, exist_ok=True)
    ca, crt, key = tls or make_ca(work / "tls")
    htpasswd = work / "htpasswd"
    htpasswd.write_text(htpasswd_line(USER, PASSWORD))
    storage = work / "storage"
    storage.mkdir(exist_ok=True)
    port = free_port()
    config = work / "config.yml"
    config.write_text(json.dumps({  # YAML is a superset of JSON
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(storage)}, "delete": {"enabled": True},
                    "maintenance": {"uploadpurging": {"enabled": False}}},
        "http": {"addr": f"127.0.0.1:{port}", "secret": "nodeprep-test-secret",
                 "tls": {"certificate": str(crt), "key": str(key)}},
        "auth": auth or {"htpasswd": {"realm": "nodeprep-test", "path": str(htpasswd)}},
        **({"middleware": {"storage": [{"name": "redirect", "options": {"baseurl": redirect}}]}}
           if redirect else {}),
    }))
    reg = Registry(work=work, port=port, ca=ca, storage=storage, config=config)
    reg.start()
    return reg


def start_redirecting_registry(work: Path, *, access_log: bool = True,
                               **kw: object) -> tuple[Registry, Nginx]:
    """A started registry (as start_registry) whose blob GETs are redirected to a started nginx
    serving the registry's storage root on loopback, with its access log unless `access_log` is
    False (tests/support/nginx.py): the registry keeps auth and manifests, nginx serves the blob
    bytes."""
    from .nginx import start_nginx

    storage = work / "storage"
    storage.mkdir(parents=True, exist_ok=True)
    web = start_nginx(work / "nginx", storage, access_log=access_log)
    try:
        return start_registry(work, redirect=web.url, **kw), web  # type: ignore[arg-type]
    except BaseException:
        web.stop()
        raise
