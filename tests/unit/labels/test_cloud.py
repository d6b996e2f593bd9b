"""Machine type and location from DMI and cloud metadata.

No cloud metadata service exists here: each one is stood in for by a loopback http.server that
implements the documented paths and header checks (AWS IMDSv2 token PUT, 401 without a token; GCE
`Metadata-Flavor: Google`; Azure `Metadata: true` + api-version). DMI comes from temp directories.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from nodeprep.labels import cloud as cloudmod
from nodeprep.labels.core import LabelOptions, node_labels

from .conftest import Recorded, Server, write_dmi

AWS_TOKEN = "AQAEAF-token=="


def aws_handler(srv: Server, req: Recorded) -> tuple[int, dict[str, str], str]:
    if req.method == "PUT" and req.path == "/latest/api/token":
        if "x-aws-ec2-metadata-token-ttl-seconds" not in req.headers:
            return 400, {}, "missing ttl"
        return 200, {}, AWS_TOKEN
    if req.method != "GET":
        return 405, {}, ""
    if req.headers.get("x-aws-ec2-metadata-token") != AWS_TOKEN:
        return 401, {}, ""
    data = {"/latest/meta-data/instance-type": "p4d.24xlarge",
            "/latest/meta-data/placement/region": "us-east-1",
            "/latest/meta-data/placement/availability-zone": "us-east-1a"}
    return (200, {}, data[req.path]) if req.path in data else (404, {}, "")


def gce_handler(srv: Server, req: Recorded) -> tuple[int, dict[str, str], str]:
    if req.headers.get("metadata-flavor") != "Google":
        return 403, {}, "Missing required header"
    data = {"/computeMetadata/v1/instance/machine-type": "projects/123456/machineTypes/a2-highgpu-1g",
            "/computeMetadata/v1/instance/zone": "projects/123456/zones/us-central1-a"}
    return (200, {"Metadata-Flavor": "Google"}, data[req.path]) if req.path in data else (404, {}, "")


def azure_handler(srv: Server, req: Recorded) -> tuple[int, dict[str, str], str]:
    url = urlsplit(req.path)
    if req.headers.get("metadata") != "true":
        return 400, {}, json.dumps({"error": "Bad request. Required metadata header not specified"})
    if "api-version" not in parse_qs(url.query):
        return 400, {}, json.dumps({"error": "Bad request. api-version was not specified"})
    if url.path == "/metadata/instance/compute":
        return 200, {"Content-Type": "application/json"}, json.dumps(
            {"vmSize": "Standard_NC24ads_A100_v4", "location": "eastus", "zone": "1", "name": "gpu-0"})
    return 404, {}, ""


AWS_DMI = dict(sys_vendor="Amazon EC2", product_name="p4d.24xlarge", board_asset_tag="i-0123456789abcdef0")
GCE_DMI = dict(sys_vendor="Google", product_name="Google Compute Engine")
AZURE_DMI = dict(sys_vendor="Microsoft Corporation", product_name="Virtual Machine",
                 chassis_asset_tag="7783-7084-3265-9085-8269-3286-77")


def endpoints(**urls: str) -> cloudmod.Endpoints:
    base = {c: "http://127.0.0.1:9" for c in cloudmod.CLOUDS}
    base.update(urls)
    return cloudmod.Endpoints(**base)


def test_guard_blocks_link_local() -> None:
    """The autouse guard in conftest refuses non-loopback connections before any packet is sent."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with pytest.raises(AssertionError, match="non-loopback"):
        s.connect(("169.254.169.254", 80))
    s.close()
    with pytest.raises(AssertionError, match="non-loopback"):
        socket.getaddrinfo("metadata.google.internal", 80)


@pytest.mark.parametrize("dmi,cloud", [
    (AWS_DMI, "aws"), ({"sys_vendor": "Xen", "product_version": "4.11.amazon"}, "aws"),
    (GCE_DMI, "gce"), (AZURE_DMI, "azure"),
    ({"sys_vendor": "Dell Inc.", "product_name": "PowerEdge XE9680"}, None), ({}, None),
])
def test_detect_cloud(dmi: dict[str, str], cloud: str | None) -> None:
    assert cloudmod.detect_cloud(dmi) == cloud


def test_aws_imdsv2(http_server: Callable[..., Server], tmp_path: Path,
                    options: Callable[..., LabelOptions]) -> None:
    srv = http_server(aws_handler)
    dmi = write_dmi(tmp_path / "aws", **AWS_DMI)
    result = node_labels(options(dmi_root=dmi, endpoints=endpoints(aws=srv.url)))
    assert result.labels["node.kubernetes.io/instance-type"] == "p4d.24xlarge"
    assert result.labels["topology.kubernetes.io/region"] == "us-east-1"
    assert result.labels["topology.kubernetes.io/zone"] == "us-east-1a"
    assert result.labels["nodeprep.dev/cloud"] == "aws"
    assert result.sources["cloud"] == "metadata" and result.warnings == []
    assert srv.requests[0].method == "PUT"
    assert all(r.headers.get("x-aws-ec2-metadata-token") == AWS_TOKEN for r in srv.requests[1:])


def test_aws_get_without_token_is_refused_by_the_stand_in(http_server: Callable[..., Server]) -> None:
    """The stand-in enforces IMDSv2: a tokenless GET gets 401 (so the client's PUT is what makes it work)."""
    import requests

    srv = http_server(aws_handler)
    s = requests.Session()
    s.trust_env = False
    assert s.get(srv.url + "/latest/meta-data/instance-type", timeout=5).status_code == 401


def test_gce(http_server: Callable[..., Server], tmp_path: Path,
             options: Callable[..., LabelOptions]) -> None:
    srv = http_server(gce_handler)
    dmi = write_dmi(tmp_path / "gce", **GCE_DMI)
    result = node_labels(options(dmi_root=dmi, endpoints=endpoints(gce=srv.url)))
    assert (result.labels["node.kubernetes.io/instance-type"], result.labels["topology.kubernetes.io/zone"],
            result.labels["topology.kubernetes.io/region"]) == (
        "a2-highgpu-1g", "us-central1-a", "us-central1")
    assert all(r.headers["metadata-flavor"] == "Google" for r in srv.requests) and len(srv.requests) == 2


def test_azure(http_server: Callable[..., Server], tmp_path: Path,
               options: Callable[..., LabelOptions]) -> None:
    srv = http_server(azure_handler)
    dmi = write_dmi(tmp_path / "az", **AZURE_DMI)
    result = node_labels(options(dmi_root=dmi, endpoints=endpoints(azure=srv.url)))
    assert result.labels["node.kubernetes.io/instance-type"] == "Standard_NC24ads_A100_v4"
    assert result.labels["topology.kubernetes.io/region"] == "eastus"
    assert result.labels["topology.kubernetes.io/zone"] == "eastus-1"
    (req,) = srv.requests
    assert req.headers["metadata"] == "true" and "api-version=" in req.path


def test_silent_metadata_server_falls_back_to_dmi(silent_server: str, tmp_path: Path,
                                                  options: Callable[..., LabelOptions]) -> None:
    """A metadata endpoint that accepts the connection and never answers: labels still come (from
    DMI) with a warning. The elapsed-time bound is only a hang guard; bench/labels.py measures it."""
    dmi = write_dmi(tmp_path / "aws", sys_vendor="Amazon EC2", product_name="g5.xlarge")
    start = time.monotonic()
    result = node_labels(options(dmi_root=dmi, endpoints=endpoints(aws=silent_server)))
    assert time.monotonic() - start < 10
    assert result.labels["node.kubernetes.io/instance-type"] == "g5.xlarge"
    assert "topology.kubernetes.io/zone" not in result.labels
    assert result.sources["cloud"] == "dmi"
    assert any("aws metadata" in w and "falling back to DMI" in w for w in result.warnings)


def test_bare_metal_asks_no_cloud(http_server: Callable[..., Server], tmp_path: Path,
                                  options: Callable[..., LabelOptions]) -> None:
    servers = {c: http_server(h) for c, h in (("aws", aws_handler), ("gce", gce_handler),
                                              ("azure", azure_handler))}
    dmi = write_dmi(tmp_path / "bm", sys_vendor="Dell Inc.", product_name="PowerEdge XE9680")
    result = node_labels(options(dmi_root=dmi, endpoints=endpoints(**{c: s.url for c, s in servers.items()})))
    assert all(not s.requests for s in servers.values())
    assert result.labels["node.kubernetes.io/instance-type"] == "PowerEdge-XE9680"
    assert "nodeprep.dev/cloud" not in result.labels and result.warnings == []


def test_cloud_none_and_explicit_cloud(http_server: Callable[..., Server], tmp_path: Path,
                                       options: Callable[..., LabelOptions]) -> None:
    aws = http_server(aws_handler)
    gce = http_server(gce_handler)
    dmi = write_dmi(tmp_path / "aws", **AWS_DMI)
    eps = endpoints(aws=aws.url, gce=gce.url)
    none = node_labels(options(dmi_root=dmi, endpoints=eps, cloud="none"))
    assert not aws.requests and none.labels["node.kubernetes.io/instance-type"] == "p4d.24xlarge"
    empty = tmp_path / "empty-dmi"
    empty.mkdir()
    named = node_labels(options(dmi_root=empty, endpoints=eps, cloud="gce"))
    assert named.labels["node.kubernetes.io/instance-type"] == "a2-highgpu-1g" and len(gce.requests) == 2


def test_gce_failure_does_not_use_dmi_as_machine_type(http_server: Callable[..., Server], tmp_path: Path,
                                                      options: Callable[..., LabelOptions]) -> None:
    srv = http_server(lambda s, r: (500, {}, "boom"))
    dmi = write_dmi(tmp_path / "gce", **GCE_DMI)
    result = node_labels(options(dmi_root=dmi, endpoints=endpoints(gce=srv.url)))
    assert "node.kubernetes.io/instance-type" not in result.labels
    assert any("HTTPError" in w for w in result.warnings)


def test_endpoints_from_env() -> None:
    eps = cloudmod.Endpoints.from_env({"NODEPREP_AWS_METADATA_URL": "http://127.0.0.1:8080/"},
                                      gce="http://127.0.0.1:1")
    assert (eps.aws, eps.gce, eps.azure) == ("http://127.0.0.1:8080", "http://127.0.0.1:1",
                                             "http://169.254.169.254")
