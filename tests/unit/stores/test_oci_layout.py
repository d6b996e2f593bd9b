"""Pure parts of the OCI store: references, tags, credentials files, challenges, manifests."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from nodeprep.artifact import IndexEntry
from nodeprep.errors import ArtifactError, ChecksumError, InputError
from nodeprep.stores import auth, oci
from nodeprep.stores.ref import parse_ref, tag_for

DIGEST = "sha256:" + "ab" * 32


def test_references() -> None:
    r = parse_ref("oci://registry.example:5000/gpu/nvidia-drivers")
    assert (r.host, r.repository, r.plain_http, r.digest) == ("registry.example:5000", "gpu/nvidia-drivers",
                                                               False, None)
    assert r.repo_url == "https://registry.example:5000/v2/gpu/nvidia-drivers/"
    pinned = parse_ref(f"oci://registry.example/drivers@{DIGEST}")
    assert pinned.digest == DIGEST and pinned.name_of("index") == "oci://registry.example/drivers:index"
    assert parse_ref("oci+http://127.0.0.1:5000/d").base_url == "http://127.0.0.1:5000/v2/"
    assert parse_ref("oci://[::1]:5000/d", insecure_http=True).base_url == "http://[::1]:5000/v2/"
    assert parse_ref("oci+http://10.0.0.1/d", insecure_http=True).plain_http


@pytest.mark.parametrize("bad,why", [
    ("oci+http://10.0.0.1/d", "needs --insecure-http"),
    ("oci://host/Upper", "not a repository name"),
    ("oci://host/", "not a repository name"),
    ("oci://host/d@sha256:xyz", "not sha256:"),
    ("oci://ho st/d", "not a registry host"),
    ("oci://host:99999/d", "out of range"),
])
def test_bad_references(bad: str, why: str) -> None:
    with pytest.raises(InputError, match=why):
        parse_ref(bad)


def test_tags_follow_the_grammar_and_stay_distinct() -> None:
    assert tag_for("nvidia-kmod-535.309.01-open-6.1.0-56-amd64.tar.zst") == \
        "nvidia-kmod-535.309.01-open-6.1.0-56-amd64.tar.zst"
    assert tag_for("nvidia-kmod-550.1-open-6.8.0+rt~1.tar.zst") == "nvidia-kmod-550.1-open-6.8.0_rt_1.tar.zst"
    long_a, long_b = "a" * 200 + "x", "a" * 200 + "y"
    assert len(tag_for(long_a)) == 128 and tag_for(long_a) != tag_for(long_b)
    assert tag_for(".hidden").startswith("_")


def write(path: Path, data: object, mode: int = 0o600) -> Path:
    path.write_text(json.dumps(data))
    os.chmod(path, mode)
    return path


def test_credentials_file(tmp_path: Path) -> None:
    pair = base64.b64encode(b"robot:pa:ss").decode()
    f = write(tmp_path / "config.json", {"auths": {"https://reg.example:5000/v1/": {"auth": pair},
                                                   "other.example": {"username": "u", "password": "p"},
                                                   "tok.example": {"identitytoken": "refresh"}}})
    c = auth.load(f, "reg.example:5000")
    assert c is not None and (c.username, c.password) == ("robot", "pa:ss")
    assert "pa:ss" not in repr(c)
    other = auth.load(f, "other.example")
    assert other is not None and other.password == "p"
    tok = auth.load(f, "tok.example")
    assert tok is not None and tok.identity_token == "refresh"
    assert auth.load(f, "nowhere.example") is None


def test_credentials_file_refusals(tmp_path: Path) -> None:
    f = write(tmp_path / "open.json", {"auths": {}}, mode=0o640)
    with pytest.raises(InputError, match="group/others"):
        auth.load(f, "h")
    with pytest.raises(InputError, match="does not exist"):
        auth.load(tmp_path / "missing.json", "h")
    bad = write(tmp_path / "bad.json", {"auths": {"h": {"auth": "!!notbase64"}}})
    with pytest.raises(InputError, match="not base64"):
        auth.load(bad, "h")
    helper = write(tmp_path / "helper.json", {"credHelpers": {"h": "ecr-login"}})
    with pytest.raises(InputError, match="credential helper"):
        auth.load(helper, "h")


def test_challenges() -> None:
    c = auth.parse_challenge('Bearer realm="https://auth.example/token",service="registry.example",'
                             'scope="repository:gpu/drivers:pull"')
    assert c is not None and c.scheme == "bearer"
    assert c.params == {"realm": "https://auth.example/token", "service": "registry.example",
                        "scope": "repository:gpu/drivers:pull"}
    basic = auth.parse_challenge('Basic realm="registry"')
    assert basic is not None and basic.scheme == "basic"


def entry(**kw: object) -> IndexEntry:
    base = dict(name="nvidia-kmod-535.309.01-proprietary-6.1.0-56-amd64.tar.zst", kind="kmod",
                driver_version="535.309.01", arch="amd64", os="debian-12", sha256="cd" * 32, size=1234,
                input_digest="ef" * 32, flavour="proprietary", kernel_release="6.1.0-56-amd64",
                vermagic="6.1.0-56-amd64 SMP preempt mod_unload modversions ")
    return IndexEntry(**{**base, **kw})  # type: ignore[arg-type]


def test_artifact_manifest_is_an_oci_artifact_and_deterministic() -> None:
    raw = oci.artifact_manifest(entry())
    assert raw == oci.artifact_manifest(entry())
    m = json.loads(raw)
    assert m["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert m["artifactType"] == "application/vnd.nodeprep.kmod.v1"
    assert m["config"]["mediaType"] == "application/vnd.oci.empty.v1+json"
    assert m["layers"] == [{"mediaType": "application/vnd.nodeprep.kmod.v1.tar+zstd",
                            "digest": "sha256:" + "cd" * 32, "size": 1234,
                            "annotations": {"org.opencontainers.image.title": entry().name}}]
    ann = m["annotations"]
    assert ann["dev.nodeprep.driver"] == "535.309.01" and ann["dev.nodeprep.kernel"] == "6.1.0-56-amd64"
    assert ann["dev.nodeprep.flavour"] == "proprietary" and ann["dev.nodeprep.os"] == "debian-12"
    assert ann["dev.nodeprep.input-digest"] == "ef" * 32
    assert oci.artifact_layer(raw, entry(), "t")["size"] == 1234


def test_artifact_manifest_must_match_the_index() -> None:
    raw = oci.artifact_manifest(entry())
    with pytest.raises(ChecksumError, match="does not match the store index"):
        oci.artifact_layer(raw, entry(sha256="00" * 32), "t")
    with pytest.raises(ArtifactError, match="not a nodeprep artifact"):
        oci.artifact_layer(raw, entry(kind="userspace"), "t")
    with pytest.raises(ArtifactError, match="malformed"):
        oci.index_layers(b"[1]", "t")


def test_index_manifest_layers() -> None:
    raw = oci.index_manifest(b'{"format":1,"artifacts":[]}\n', b"{}")
    index, refs = oci.index_layers(raw, "t")
    assert index["mediaType"] == "application/vnd.nodeprep.index.v1+json"
    assert refs["mediaType"] == "application/vnd.nodeprep.refs.v1+json"
    assert json.loads(raw)["artifactType"] == "application/vnd.nodeprep.index.v1"
