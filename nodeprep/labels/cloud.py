"""Machine type and location: DMI decides which cloud to ask, then that cloud's metadata service.

A metadata service is only contacted when DMI says the machine runs in that cloud or when the caller
names the cloud. Every request is bounded by the caller's deadline; requests ignore proxy settings
(metadata is link-local).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..sysfs import read_attr

if TYPE_CHECKING:
    import requests

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


class _Client:
    """GETs against one metadata base URL, each bounded by the time left until `deadline`."""

    def __init__(self, base: str, deadline: float, per_request: float) -> None:
        self.base = base
        self.deadline = deadline
        self.per_request = per_request
        import requests  # only when a metadata service is asked: a ~50 ms import

        self.session = requests.Session()
        self.session.trust_env = False  # no proxies, no .netrc: metadata is link-local

    def _timeout(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0.01:
            raise TimeoutError("metadata time budget spent")
        return min(self.per_request, left)

    def request(self, method: str, path: str, **kw: object) -> requests.Response:
        t = self._timeout()
        return self.session.request(method, self.base + path, timeout=(t, t), allow_redirects=False, **kw)

    def text(self, path: str, headers: dict[str, str]) -> str:
        r = self.request("GET", path, headers=headers)
        r.raise_for_status()
        return r.text.strip()

    def close(self) -> None:
        self.session.close()


def query_aws(c: _Client) -> CloudFacts:
    headers: dict[str, str] = {}
    r = c.request("PUT", "/latest/api/token", headers={"X-aws-ec2-metadata-token-ttl-seconds": AWS_TOKEN_TTL})
    if r.status_code == 200:
        headers["X-aws-ec2-metadata-token"] = r.text.strip()
    elif r.status_code not in (403, 404, 405):
        r.raise_for_status()  # otherwise: IMDSv1-only endpoint, go on without a token
    itype = c.text("/latest/meta-data/instance-type", headers)
    zone = c.text("/latest/meta-data/placement/availability-zone", headers)
    import requests

    try:
        region = c.text("/latest/meta-data/placement/region", headers)
    except requests.HTTPError:
        region = zone[:-1] if zone and zone[-1].isalpha() else None  # us-east-1a -> us-east-1
    return CloudFacts("aws", itype, region, zone, "metadata")


def query_gce(c: _Client) -> CloudFacts:
    headers = {"Metadata-Flavor": "Google"}
    mtype = c.text("/computeMetadata/v1/instance/machine-type", headers).rsplit("/", 1)[-1]
    zone = c.text("/computeMetadata/v1/instance/zone", headers).rsplit("/", 1)[-1]
    region = zone.rsplit("-", 1)[0] if zone.count("-") >= 2 else None  # us-central1-a -> us-central1
    return CloudFacts("gce", mtype, region, zone, "metadata")


def query_azure(c: _Client) -> CloudFacts:
    r = c.request("GET", f"/metadata/instance/compute?api-version={AZURE_API_VERSION}&format=json",
                  headers={"Metadata": "true"})
    r.raise_for_status()
    data = json.loads(r.text)
    location = (data.get("location") or "").strip() or None
    zone = str(data.get("zone") or "").strip()
    return CloudFacts("azure", (data.get("vmSize") or "").strip() or None, location,
                      f"{location}-{zone}" if location and zone else None, "metadata")


QUERIES = {"aws": query_aws, "gce": query_gce, "azure": query_azure}


def query_metadata(cloud: str, endpoints: Endpoints, deadline: float, per_request: float) -> CloudFacts:
    client = _Client(endpoints.for_cloud(cloud), deadline, per_request)
    try:
        return QUERIES[cloud](client)
    finally:
        client.close()
