"""The Kubernetes API client nodeprep's commands share: a kubeconfig's server, CA and credentials
(`load_kubeconfig`), a requests session that honours them (`api_session`), the one line a refusal
reads as (`status_message`) and the default Node name; and for a long-running service a keep-alive
`Connection` on the standard library (http.client, ssl) with the same credentials, which spares it
requests' import (about 12 MB resident: bench/health.py). Below both nodeprep.labels (`labels --apply`)
and nodeprep.join (`verify-gpus`, `verify-nodes`); it knows no resource but what its callers send.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from .errors import InputError, NetworkError, NodeprepError

if TYPE_CHECKING:
    import http.client

    import requests

PATCH_TYPE = "application/merge-patch+json"


@dataclass(frozen=True)
class KubeConfig:
    server: str
    ca_file: Path | None = None
    ca_data: bytes | None = None
    insecure: bool = False
    cert_file: Path | None = None
    cert_data: bytes | None = None
    key_file: Path | None = None
    key_data: bytes | None = None
    token: str | None = field(default=None, repr=False)


def _named(items: Any, name: str | None, what: str, path: Path) -> dict[str, Any]:
    if not isinstance(items, list) or not items:
        raise InputError(f"{path}: no {what}s defined")
    for item in items:
        if isinstance(item, dict) and (name is None or item.get("name") == name):
            body = item.get(what)
            if isinstance(body, dict):
                return body
    raise InputError(f"{path}: {what} {name!r} not found")


def load_kubeconfig(path: Path, context: str | None = None) -> KubeConfig:
    """Server, CA and credentials of `context` (default: current-context) in a kubeconfig file."""
    # lazy: import nodeprep.kubeapi
    from .yamlinput import load_yaml

    _, document = load_yaml(path)  # the strict, bounded reader of every user YAML file
    data = document.data
    if not isinstance(data, dict):
        raise InputError(f"{path}: not a kubeconfig (expected a mapping)")
    ctx_name = context or data.get("current-context")
    ctx = _named(data.get("contexts"), ctx_name, "context", path) if data.get("contexts") else {}
    cluster = _named(data.get("clusters"), ctx.get("cluster"), "cluster", path)
    users = data.get("users") or []
    user = _named(users, ctx.get("user"), "user", path) if users else {}
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise InputError(f"{path}: cluster server {server!r} is not an http(s) URL")
    base = path.parent

    def file(value: Any) -> Path | None:
        return (base / value) if isinstance(value, str) and value else None

    def b64(value: Any, name: str) -> bytes | None:
        if not value:
            return None
        try:
            return base64.b64decode(value, validate=True)
        except (ValueError, TypeError):
            raise InputError(f"{path}: {name} is not valid base64") from None

    token = user.get("token")
    if not token and user.get("tokenFile"):
        token_file = file(user["tokenFile"])
        if token_file is None:
            raise InputError(f"{path}: users[].user.tokenFile is not a file name")
        try:
            token = token_file.read_text().strip()
        except OSError as e:
            raise InputError(f"{path}: cannot read tokenFile ({e.strerror})") from None
    return KubeConfig(
        server=server.rstrip("/"),
        ca_file=file(cluster.get("certificate-authority")),
        ca_data=b64(cluster.get("certificate-authority-data"), "certificate-authority-data"),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        cert_file=file(user.get("client-certificate")),
        cert_data=b64(user.get("client-certificate-data"), "client-certificate-data"),
        key_file=file(user.get("client-key")),
        key_data=b64(user.get("client-key-data"), "client-key-data"),
        token=token or None,
    )


@contextmanager
def credential_files(cfg: KubeConfig) -> Iterator[tuple[str | None, str | None, str | None]]:
    """(CA, client certificate, client key) as file names: inline (*-data) credentials go to 0600
    files in a private temporary directory, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="nodeprep-kube-") as tmp:
        def materialise(data: bytes | None, fallback: Path | None, name: str) -> str | None:
            if data is None:
                return str(fallback) if fallback else None
            p = Path(tmp) / name
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return str(p)

        yield (materialise(cfg.ca_data, cfg.ca_file, "ca.crt"),
               materialise(cfg.cert_data, cfg.cert_file, "client.crt"),
               materialise(cfg.key_data, cfg.key_file, "client.key"))


@contextmanager
def api_session(cfg: KubeConfig) -> Iterator[requests.Session]:
    """A requests session honouring the kubeconfig's CA, client certificate/key and token."""
    # lazy: import nodeprep.kubeapi
    import requests

    with credential_files(cfg) as (ca, cert, key):
        s = requests.Session()
        s.trust_env = False
        s.verify = False if cfg.insecure else (ca or True)
        if cert:
            s.cert = (cert, key) if key else cert
        if cfg.token:
            s.headers["Authorization"] = f"Bearer {cfg.token}"
        s.headers["Accept"] = "application/json"
        s.headers["User-Agent"] = "nodeprep-labels"
        try:
            yield s
        finally:
            s.close()


def default_node_name() -> str:
    return socket.gethostname().split(".")[0].lower()


def status_message(r: requests.Response) -> str:
    """The API server's own message of a refused request (its Status `message`), else the reason."""
    try:
        return str(r.json().get("message", "")) or r.reason
    except ValueError:
        return r.reason or ""


def api_request(s: requests.Session, method: str, url: str, server: str, body: Any = None, *,
                timeout: float, content_type: str = PATCH_TYPE) -> requests.Response:
    """One request of session `s` (`body` sent as JSON with `content_type`); an API server that does
    not answer, or whose TLS fails verification, is one NetworkError line naming `server`."""
    # lazy: import nodeprep.kubeapi
    import requests

    try:
        return s.request(method, url, timeout=timeout, data=json.dumps(body) if body is not None else None,
                         headers={"Content-Type": content_type} if body is not None else {})
    except requests.exceptions.SSLError as e:
        raise NetworkError(f"{server}: TLS verification failed ({e})") from None
    except requests.RequestException as e:
        raise NetworkError(f"{server}: {type(e).__name__}: {e}") from None


def object_answer(r: requests.Response, server: str, what: str) -> dict[str, Any]:
    """The JSON object of a 200 answer to `what` (e.g. "reading node 'n1'"), else one NodeprepError line."""
    if r.status_code != 200:
        raise NodeprepError(f"{server}: {what} failed (HTTP {r.status_code} {status_message(r)})")
    try:
        data = r.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise NodeprepError(f"{server}: {what}: the answer is not a JSON object")
    return data


def read_node(cfg: KubeConfig, node: str, *, timeout: float = 10.0) -> dict[str, Any]:
    """GET the Node, once (what a `--check` plans against; nothing is written)."""
    with api_session(cfg) as s:
        r = api_request(s, "GET", f"{cfg.server}/api/v1/nodes/{quote(node, safe='')}", cfg.server,
                        timeout=timeout)
    if r.status_code == 404:
        raise InputError(f"node {node!r} not found at {cfg.server}")
    return object_answer(r, cfg.server, f"reading node {node!r}")


@dataclass
class Connection:
    """One keep-alive HTTP(S) connection to the API server with the kubeconfig's credentials (files
    from `credential_files`), on http.client and ssl. `request` answers (status, JSON body or None,
    the server's message); an API server that does not answer is NetworkError, and the next request
    connects again."""

    cfg: KubeConfig
    files: tuple[str | None, str | None, str | None]
    timeout: float = 10.0
    conn: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        # lazy: import nodeprep.kubeapi
        import http.client
        import ssl

        parts = urlsplit(self.cfg.server)
        host, port = parts.hostname or "", parts.port
        if parts.scheme == "http":
            return http.client.HTTPConnection(host, port, timeout=self.timeout)
        ca, cert, key = self.files
        ctx = ssl.create_default_context(cafile=ca) if ca and not self.cfg.insecure else \
            ssl.create_default_context()
        if self.cfg.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if cert:
            ctx.load_cert_chain(cert, key)
        return http.client.HTTPSConnection(host, port, timeout=self.timeout, context=ctx)

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = PATCH_TYPE) -> tuple[int, Any, str]:
        # lazy: import nodeprep.kubeapi
        import http.client
        import ssl

        headers = {"Accept": "application/json", "User-Agent": "nodeprep-health"}
        if self.cfg.token:
            headers["Authorization"] = f"Bearer {self.cfg.token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        base = urlsplit(self.cfg.server).path.rstrip("/")
        try:
            if self.conn is None:
                self.conn = self._connect()
            self.conn.request(method, base + path, body=data, headers=headers)
            r = self.conn.getresponse()
            raw = r.read(4 * 1024 * 1024)
        except ssl.SSLError as e:
            self.close()
            raise NetworkError(f"{self.cfg.server}: TLS verification failed ({e})") from None
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise NetworkError(f"{self.cfg.server}: {type(e).__name__}: {e}") from None
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = None
        message = str(parsed.get("message", "")) if isinstance(parsed, dict) else ""
        return r.status, parsed, message or r.reason

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


@contextmanager
def connection(cfg: KubeConfig, timeout: float = 10.0) -> Iterator[Connection]:
    """A `Connection` for the lifetime of the block (its credential files with it)."""
    with credential_files(cfg) as files:
        c = Connection(cfg, files, timeout)
        try:
            yield c
        finally:
            c.close()
