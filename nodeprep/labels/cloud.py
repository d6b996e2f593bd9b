"""Machine type and location: DMI decides which cloud to ask, then that cloud's metadata service.

A metadata service is only contacted when DMI says the machine runs in that cloud or when the caller
names the cloud. All requests of one query share one wall-clock deadline that covers connecting,
sending and every read (a server that drips bytes cannot stretch it), and answers are capped at
MAX_RESPONSE bytes; requests ignore proxy settings and redirects (metadata is link-local).
"""

from __future__ import annotations

import http.client
import io
import json
import logging
import os
import socket
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..sysfs import read_attr
from ..urls import redact_url

log = logging.getLogger(__name__)

CLOUDS = ("aws", "gce", "azure")
CLOUD_CHOICES = ("auto", "aws", "gce", "azure", "none")
DEFAULT_ENDPOINTS = {
    "aws": "http://169.254.169.254",
    "gce": "http://metadata.google.internal",
    "azure": "http://169.254.169.254",
}
ENDPOINT_ENV = {
    "aws": "NODEPREP_AWS_METADATA_URL",
    "gce": "NODEPREP_GCE_METADATA_URL",
    "azure": "NODEPREP_AZURE_METADATA_URL",
}
AZURE_API_VERSION = "2021-02-01"
AZURE_ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"
AWS_TOKEN_TTL = "21600"
MAX_RESPONSE = 64 * 1024  # a metadata answer nodeprep reads is a few hundred bytes
DMI_FIELDS = ("sys_vendor", "product_name", "product_version", "board_asset_tag", "chassis_asset_tag",
              "bios_vendor", "bios_version")
PLACEHOLDER_PRODUCTS = {"", "to be filled by o.e.m.", "system product name", "default string",
                        "not specified", "none", "unknown", "hvm domu"}


@dataclass(frozen=True)
class Endpoints:
    aws: str = DEFAULT_ENDPOINTS["aws"]
    gce: str = DEFAULT_ENDPOINTS["gce"]
    azure: str = DEFAULT_ENDPOINTS["azure"]

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: str | None) -> Endpoints:
        """Defaults, then NODEPREP_<CLOUD>_METADATA_URL, then explicit (non-None) overrides."""
        env = dict(os.environ) if env is None else env
        values = {c: env.get(ENDPOINT_ENV[c]) or DEFAULT_ENDPOINTS[c] for c in CLOUDS}
        values.update({k: v for k, v in overrides.items() if v})
        return cls(**{k: v.rstrip("/") for k, v in values.items()})

    def for_cloud(self, cloud: str) -> str:
        return str(getattr(self, cloud))


@dataclass(frozen=True)
class CloudFacts:
    cloud: str | None  # aws | gce | azure | None (bare metal / unknown)
    instance_type: str | None = None
    region: str | None = None
    zone: str | None = None
    source: str = "none"  # metadata | dmi | none


def read_dmi(dmi_root: Path, problems: list[str] | None = None) -> dict[str, str]:
    """The DMI fields nodeprep looks at. Missing ones are left out; unsafe (FIFO, symlink, huge) or
    undecodable ones too, with one line each in `problems` (nodeprep.sysfs)."""
    out = {}
    for name in DMI_FIELDS:
        text = read_attr(dmi_root / name, problems)
        if text is not None:
            out[name] = text.strip()
    return out


def detect_cloud(dmi: dict[str, str]) -> str | None:
    """Which cloud DMI points at (the same hints cloud-init's ds-identify uses), or None."""
    vendor = dmi.get("sys_vendor", "").lower()
    product = dmi.get("product_name", "").lower()
    versions = (dmi.get("product_version", "") + " " + dmi.get("bios_version", "")).lower()
    if vendor == "amazon ec2" or dmi.get("bios_vendor", "").lower() == "amazon ec2" or "amazon" in versions:
        return "aws"
    if dmi.get("board_asset_tag", "").startswith("i-") and vendor.startswith("amazon"):
        return "aws"
    if product == "google compute engine" or vendor == "google":
        return "gce"
    if dmi.get("chassis_asset_tag", "") == AZURE_ASSET_TAG:
        return "azure"
    return None


def dmi_instance_type(dmi: dict[str, str]) -> str | None:
    """DMI product name as a machine type (AWS Nitro and bare metal), None for placeholders."""
    product = dmi.get("product_name", "")
    return None if product.strip().lower() in PLACEHOLDER_PRODUCTS else product


class MetadataError(Exception):
    """A metadata answer that cannot be used."""


class HTTPError(MetadataError):
    """A status other than 2xx."""

    def __init__(self, status: int, path: str) -> None:
        super().__init__(f"HTTP {status} for {path}")
        self.status = status


class ResponseTooLarge(MetadataError):
    """The answer is larger than MAX_RESPONSE."""


class _DeadlineSocket:
    """A connected socket whose every send and receive is bounded by one wall-clock deadline, so a
    server that accepts and never answers, or drips a byte at a time, cannot outlast it."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline
        self._refs = 0
        self._closed = False

    def _arm(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("metadata time budget spent")
        self._sock.settimeout(left)

    def sendall(self, data: bytes) -> None:
        self._arm()
        self._sock.sendall(data)

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        self._arm()
        return self._sock.recv_into(buffer, nbytes, flags)

    # Like socket.socket: the connection may close the socket while its response still reads from a
    # file made by makefile(); the real close waits for that file to be closed too.
    def makefile(self, mode: str = "rb", *args: Any, **kw: Any) -> io.BufferedReader:
        self._refs += 1
        # SocketIO is typed for a socket.socket: it reads with recv_into and closes with
        # _decref_socketios, both defined here
        return io.BufferedReader(socket.SocketIO(self, "rb"))  # type: ignore[arg-type]

    def _decref_socketios(self) -> None:  # called by SocketIO.close
        self._refs -= 1
        if self._closed and self._refs <= 0:
            self._sock.close()

    def close(self) -> None:
        self._closed = True
        if self._refs <= 0:
            self._sock.close()


class _Connection(http.client.HTTPConnection):
    """http.client connection whose connect, TLS handshake and every read end by `deadline`."""

    def __init__(self, host: str, port: int | None, deadline: float, tls: bool) -> None:
        super().__init__(host, port or (443 if tls else 80))
        self._deadline = deadline
        self._tls = tls

    def connect(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("metadata time budget spent")
        sock = socket.create_connection((self.host, self.port), timeout=left)
        if self._tls:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
        self.sock = _DeadlineSocket(sock, self._deadline)


@dataclass(frozen=True)
class Response:
    status: int
    text: str


class _Client:
    """Requests against one metadata base URL, all of them (connect, send, every read) ending by one
    `deadline` (time.monotonic()); answers are capped at MAX_RESPONSE bytes. No proxies, no
    redirects: metadata is link-local."""

    def __init__(self, base: str, deadline: float) -> None:
        url = urlsplit(base)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise MetadataError(f"{redact_url(base)} is not an http(s) URL")
        self.host, self.port, self.tls = url.hostname, url.port, url.scheme == "https"
        self.prefix = url.path.rstrip("/")
        self.deadline = deadline

    def request(self, method: str, path: str, headers: dict[str, str] | None = None) -> Response:
        conn = _Connection(self.host, self.port, self.deadline, self.tls)
        resp: http.client.HTTPResponse | None = None
        try:
            conn.request(method, self.prefix + path, headers=headers or {})
            resp = conn.getresponse()
            length = resp.getheader("Content-Length")
            if length and length.strip().isdigit() and int(length) > MAX_RESPONSE:
                raise ResponseTooLarge(f"answer of {int(length)} bytes (more than {MAX_RESPONSE})")
            body = resp.read(MAX_RESPONSE + 1)
            if len(body) > MAX_RESPONSE:
                raise ResponseTooLarge(f"answer larger than {MAX_RESPONSE} bytes")
            return Response(resp.status, body.decode("utf-8", errors="replace"))
        except http.client.HTTPException as e:
            raise MetadataError(f"bad HTTP answer ({type(e).__name__})") from None
        finally:
            if resp is not None:
                resp.close()
            conn.close()

    def text(self, path: str, headers: dict[str, str]) -> str:
        r = self.request("GET", path, headers=headers)
        if not 200 <= r.status < 300:
            raise HTTPError(r.status, path.split("?", 1)[0])
        return r.text.strip()

    def close(self) -> None:
        pass


def query_aws(c: _Client) -> CloudFacts:
    headers: dict[str, str] = {}
    r = c.request("PUT", "/latest/api/token", headers={"X-aws-ec2-metadata-token-ttl-seconds": AWS_TOKEN_TTL})
    if r.status == 200:
        headers["X-aws-ec2-metadata-token"] = r.text.strip()
    elif r.status not in (403, 404, 405):
        raise HTTPError(r.status, "/latest/api/token")  # else: IMDSv1-only endpoint, no token
    itype = c.text("/latest/meta-data/instance-type", headers)
    zone = c.text("/latest/meta-data/placement/availability-zone", headers)
    region: str | None
    try:
        region = c.text("/latest/meta-data/placement/region", headers)
    except HTTPError:
        region = zone[:-1] if zone and zone[-1].isalpha() else None  # us-east-1a -> us-east-1
    return CloudFacts("aws", itype, region, zone, "metadata")


def query_gce(c: _Client) -> CloudFacts:
    headers = {"Metadata-Flavor": "Google"}
    mtype = c.text("/computeMetadata/v1/instance/machine-type", headers).rsplit("/", 1)[-1]
    zone = c.text("/computeMetadata/v1/instance/zone", headers).rsplit("/", 1)[-1]
    region = zone.rsplit("-", 1)[0] if zone.count("-") >= 2 else None  # us-central1-a -> us-central1
    return CloudFacts("gce", mtype, region, zone, "metadata")


def query_azure(c: _Client) -> CloudFacts:
    data = json.loads(c.text(f"/metadata/instance/compute?api-version={AZURE_API_VERSION}&format=json",
                             {"Metadata": "true"}))
    if not isinstance(data, dict):
        raise MetadataError("azure: compute metadata is not a JSON object")
    location = (data.get("location") or "").strip() or None
    zone = str(data.get("zone") or "").strip()
    return CloudFacts("azure", (data.get("vmSize") or "").strip() or None, location,
                      f"{location}-{zone}" if location and zone else None, "metadata")


QUERIES = {"aws": query_aws, "gce": query_gce, "azure": query_azure}


def query_metadata(cloud: str, endpoints: Endpoints, deadline: float) -> CloudFacts:
    """Ask `cloud`'s metadata service; every request of it ends by `deadline` (time.monotonic())."""
    return QUERIES[cloud](_Client(endpoints.for_cloud(cloud), deadline))
