"""The OCI registry store against a real registry: Debian's docker-registry (CNCF distribution)
started on loopback with TLS from a test CA and htpasswd auth (tests/support/registry.py, one per
session). The shared real driver build is pushed with `nodeprep artifacts push` and installed on
test roots with `nodeprep install --store oci://...`; every refusal is one `error:` line with the
documented exit code and leaves the root as it was."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import ssl
import urllib.request
from pathlib import Path

import pytest

from nodeprep import artifact
from nodeprep.stores.ref import tag_for
from tests.slow.node.helpers import cli
from tests.support.faultproxy import FaultProxy, Faults
from tests.support.registry import write_auth_file

from .conftest import REPO_NAME, Published

pytestmark = pytest.mark.slow


def install(p: Published, root: Path, *extra: str, store: str | None = None,
            env: dict[str, str] | None = None, auth: Path | None = None, ca: bool = True):  # type: ignore[no-untyped-def]
    args = ["install", "--store", store or p.location, "--driver", p.version, "--kernel", p.kernel,
            "--root", str(root), "--registry-auth", str(auth or p.auth)]
    if ca:
        args += ["--ca-file", str(p.registry.ca)]
    return cli(*args, *extra, env=env)


def snapshot(root: Path) -> dict[str, str]:
    """Every file and link under root with its content digest, minus the node lock and nodeprep's
    download cache (var/cache/nodeprep keeps verified or partial downloads for the next run)."""
    out: dict[str, str] = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            if rel == "var/lib/nodeprep/lock" or rel.startswith("var/cache/nodeprep/"):
                continue
            out[rel] = os.readlink(p) if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def fresh_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/hostname").write_text("gpu-node-1\n")
    return root


def assert_refused(r, code: int, needle: str) -> None:  # type: ignore[no-untyped-def]
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode == code, r.stderr
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr
    assert "s3cret" not in r.stderr + r.stdout


def registry_get(p: Published, path: str, accept: str = "application/json", *,
                 repo: str = REPO_NAME) -> bytes:
    import base64

    from tests.support.registry import PASSWORD, USER

    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    req = urllib.request.Request(f"https://{p.registry.host}/v2/{repo}/{path}",
                                 headers={"Accept": accept, "Authorization": "Basic " + basic})
    ctx = ssl.create_default_context(cafile=str(p.registry.ca))
    with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
        return bytes(resp.read())


def test_push_real_build_then_install_from_the_registry(published: Published, tmp_path: Path) -> None:
    p = published
    tags = json.loads(registry_get(p, "tags/list"))["tags"]
    assert set(tags) >= {"index", tag_for(p.kmod.name), tag_for(p.userspace.name)}
    manifest = json.loads(registry_get(p, f"manifests/{tag_for(p.kmod.name)}",
                                       "application/vnd.oci.image.manifest.v1+json"))
    assert manifest["artifactType"] == "application/vnd.nodeprep.kmod.v1"
    assert manifest["layers"][0]["digest"] == "sha256:" + p.kmod.sha256
    assert manifest["annotations"]["dev.nodeprep.kernel"] == p.kernel
    assert manifest["annotations"]["dev.nodeprep.input-digest"] == p.kmod.input_digest

    root = fresh_root(tmp_path)
    r = install(p, root, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["installed_kmod"] is True
    vdir = root / "opt/nvidia" / p.version
    us_manifest = artifact.Manifest.from_json((vdir / "manifest.json").read_bytes())
    assert (us_manifest.kind, us_manifest.input_digest) == ("userspace", p.userspace.input_digest)
    kmod_manifest = artifact.Manifest.from_json((vdir / "modules" / p.kernel / "manifest.json").read_bytes())
    assert kmod_manifest.input_digest == p.kmod.input_digest
    assert (vdir / "modules" / p.kernel / "nvidia.ko").is_file()
    assert not list((root / "var/cache/nodeprep").glob("*"))  # downloads dropped after the install

    again = install(p, root, "--json")  # installed: the registry is not asked again
    assert again.returncode == 0 and json.loads(again.stdout)["changed"] is False

    listed = cli("artifacts", "list", p.location, "--registry-auth", str(p.auth), "--ca-file",
                 str(p.registry.ca), "--json")
    assert {e["name"] for e in json.loads(listed.stdout)} >= {p.kmod.name, p.userspace.name}


def test_install_pinned_by_index_digest(published: Published, tmp_path: Path) -> None:
    p = published
    root = fresh_root(tmp_path)
    r = install(p, root, store=f"{p.location}@{p.index_digest}")
    assert r.returncode == 0, r.stderr
    assert (root / "opt/nvidia" / p.version / "manifest.json").is_file()


def test_refusals_are_one_line_and_leave_the_root_as_it_was(published: Published, tmp_path: Path) -> None:
    p = published
    root = fresh_root(tmp_path)
    before = snapshot(root)
    wrong = write_auth_file(tmp_path / "wrong.json", p.registry.host, password="not-the-password")
    nobody = write_auth_file(tmp_path / "nobody.json", "elsewhere.example:5000")
    readable = write_auth_file(tmp_path / "readable.json", p.registry.host)
    readable.chmod(0o644)
    kmod_manifest = "sha256:" + hashlib.sha256(registry_get(
        p, f"manifests/{tag_for(p.kmod.name)}", "application/vnd.oci.image.manifest.v1+json")).hexdigest()
    cases = [
        (dict(auth=wrong), 2, "refused the credentials"),
        (dict(auth=nobody), 2, "requires authentication"),
        (dict(auth=readable), 2, "group/others"),
        (dict(store=p.registry.url("gpu/never-published")), 2, "no 'index' tag"),
        (dict(store=f"{p.location}@sha256:{'0' * 64}"), 2, "pinned index digest is not in the repository"),
        (dict(store=f"{p.location}@{kmod_manifest}"), 2, "pinned digest must be the index"),
        (dict(ca=False), 1, "certificate verify failed"),
    ]
    for kw, code, needle in cases:
        r = install(p, root, **kw)  # type: ignore[arg-type]
        assert_refused(r, code, needle)
        assert snapshot(root) == before, kw


def test_corrupted_blob_in_the_registry_is_refused(published: Published, tmp_path: Path) -> None:
    install_with_corrupted_kmod(published, tmp_path)


def install_with_corrupted_kmod(p: Published, tmp_path: Path) -> None:
    """Garbage written into the kmod's blob file in the registry's storage, then an install: refused
    by digest with one line (exit 2), the root as it was, no partial download left; the blob is
    restored afterwards."""
    data = p.registry.blob_data("sha256:" + p.kmod.sha256)
    saved = tmp_path / "blob.saved"
    shutil.copyfile(data, saved)
    root = fresh_root(tmp_path)
    before = snapshot(root)
    try:
        with open(data, "r+b") as f:
            f.seek(4096)
            f.write(b"garbage" * 64)
        r = install(p, root)
    finally:
        shutil.copyfile(saved, data)
    assert_refused(r, 2, "does not match the expected " + p.kmod.sha256)
    assert snapshot(root) == before
    assert not (root / "var/cache/nodeprep" / (p.kmod.name + ".part")).exists()


def test_registry_down_mid_pull_then_resume(published: Published, tmp_path: Path) -> None:
    """The registry goes away 8 MiB into the kmod blob (a loopback proxy in front of it stops
    answering): one line, exit 1, nothing installed. Back up, the next run resumes the blob: the
    proxy serves only the rest of it."""
    p = published
    blob_path = f"/blobs/sha256:{p.kmod.sha256}"
    env = {"NODEPREP_FETCH_ATTEMPTS": "2", "NODEPREP_FETCH_BACKOFF": "0.01"}
    root = fresh_root(tmp_path)
    before = snapshot(root)
    with FaultProxy(upstream=f"https://{p.registry.host}", cafile=p.registry.ca) as proxy:
        store = f"oci+http://127.0.0.1:{proxy.port}/{REPO_NAME}"
        auth = write_auth_file(tmp_path / "proxy.json", f"127.0.0.1:{proxy.port}")
        proxy.reset(Faults(match=blob_path, down_after=8 << 20))
        r = install(p, root, store=store, env=env, ca=False, auth=auth)
        assert_refused(r, 1, "gave up after 2 tries")
        assert snapshot(root) == before
        part = root / "var/cache/nodeprep" / (p.kmod.name + ".part")
        kept = part.stat().st_size
        assert 0 < kept <= 8 << 20
        proxy.reset()
        r = install(p, root, store=store, env=env, ca=False, auth=auth)
        assert r.returncode == 0, r.stderr
        assert proxy.served_for(blob_path) == p.kmod.size - kept
        assert [s.range for s in proxy.seen if blob_path in s.path] == [f"bytes={kept}-"]


def test_bearer_token_flow(real_build, published: Published, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A second registry in token mode (distribution's `auth: token`), its realm a loopback token
    service (tests/support/tokenserver.py) that signs JWTs for the test user: nodeprep answers the
    `Bearer realm=...` challenge with the credentials file, for push and for pull."""
    from tests.support.registry import PASSWORD, USER, start_registry
    from tests.support.tokenserver import TokenServer

    reg0 = published.registry
    tls = (reg0.ca, reg0.ca.parent / "server.crt", reg0.ca.parent / "server.key")
    with TokenServer(tmp_path, user=USER, password=PASSWORD, tls_cert=tls[1], tls_key=tls[2]) as tokens, \
            start_registry(tmp_path / "registry", auth=tokens.registry_auth(), tls=tls) as reg:
        auth = write_auth_file(tmp_path / "config.json", reg.host)
        location = reg.url("gpu/token-drivers")
        pushed = cli("artifacts", "push", str(real_build.store), location, "--registry-auth", str(auth),
                     "--ca-file", str(reg.ca))
        assert pushed.returncode == 0, pushed.stderr
        root = fresh_root(tmp_path)
        p = Published(reg, location, auth, "", published.version, published.kernel, published.kmod,
                      published.userspace)
        r = install(p, root)
        assert r.returncode == 0, r.stderr
        assert (root / "opt/nvidia" / p.version / "manifest.json").is_file()
        assert tokens.issued >= 2  # one for the push scope, one for the pull
        wrong = write_auth_file(tmp_path / "wrong.json", reg.host, password="nope")
        other = fresh_root(tmp_path / "other")
        assert_refused(install(p, other, auth=wrong), 2, "token service refused the credentials")


def test_build_driver_publishes_to_the_registry(real_build, published: Published,  # type: ignore[no-untyped-def]
                                                tmp_path: Path) -> None:
    """`build-driver --store oci://...` with the shared build's cache: nothing compiles, the
    byte-identical artifacts land in the registry and the pushed index is what a node installs."""
    p = published
    location = p.registry.url("gpu/built-drivers")
    r = cli("build-driver", "--driver", p.version, "--kernel", p.kernel, "--flavour", real_build.flavour,
            "--cache", str(real_build.cache), "--no-smoke-test", "--store", location,
            "--registry-auth", str(p.auth), "--ca-file", str(p.registry.ca), "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["compiled"] is False and out["pushed_index"].startswith("sha256:")
    listed = cli("artifacts", "list", f"{location}@{out['pushed_index']}", "--registry-auth", str(p.auth),
                 "--ca-file", str(p.registry.ca), "--json")
    by_name = {e["name"]: e for e in json.loads(listed.stdout)}
    # the same build into a directory store: the registry holds exactly those bytes
    plain = cli("build-driver", "--driver", p.version, "--kernel", p.kernel, "--flavour", real_build.flavour,
                "--cache", str(real_build.cache), "--no-smoke-test", "--store", str(tmp_path / "dir"),
                "--json")
    assert plain.returncode == 0, plain.stderr[-3000:]
    local = {e.name: e for e in artifact.LocalStore(tmp_path / "dir").entries()}
    assert by_name[p.kmod.name]["sha256"] == local[p.kmod.name].sha256
    assert by_name[p.userspace.name]["sha256"] == local[p.userspace.name].sha256
