"""`build-driver --builder podman --store oci://...` for real: podman 4.3 builds
images/debian-12/Containerfile (its `RUN apt-get install` against the Debian mirror), runs the
build `--privileged` in it with the shared real build's cache mounted (the compile is a cache hit),
and the host pushes the result to the session's registry (TLS, htpasswd); the registry credentials
never reach the container. The artifact holds the host build's tar (the kmod is compressed by the
image's zstd, so its .tar.zst bytes are the image's own).

Stand-ins, each at one boundary:
- the Containerfile's base image `docker.io/library/debian:12` cannot be pulled here (no registry
  on the internet): the Debian 12 minbase tree nodeprep's mmdebstrap made for the build (the same
  command as images/debian-12/mmdebstrap.sh) is imported under that name, in an image store private
  to this test (CONTAINERS_STORAGE_CONF), reset and removed afterwards;
- this sandbox caps RLIMIT_NOFILE/NPROC below podman's defaults for containers and lacks
  CAP_SYS_RESOURCE, so runc cannot set them: the test's containers.conf (CONTAINERS_CONF) asks for
  limits inside the sandbox's (as tests/slow/join/gpunode.py does with --ulimit)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeprep import targets
from nodeprep.builder import buildroot
from tests.slow.node.helpers import cli
from tests.support.realbuild import real_build_request
from tests.support.registry import PASSWORD

from .conftest import Published
from .test_oci_registry import registry_get

pytestmark = pytest.mark.slow


@pytest.fixture
def podman_env(real_build, tmp_path: Path) -> Iterator[dict[str, str]]:  # type: ignore[no-untyped-def]
    """A private podman configuration and image store holding `docker.io/library/debian:12`."""
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed (scripts/deps/join.apt installs it)")
    work = tmp_path / "podman"
    work.mkdir()
    (work / "containers.conf").write_text(
        '[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]\n')
    (work / "storage.conf").write_text(
        f'[storage]\ndriver = "overlay"\ngraphroot = "{work}/graph"\nrunroot = "{work}/run"\n')
    env = {"CONTAINERS_CONF": str(work / "containers.conf"),
           "CONTAINERS_STORAGE_CONF": str(work / "storage.conf")}
    full = {**os.environ, **env}
    try:
        _req, archive = real_build_request(real_build.cache)
        recipe = buildroot.recipe_for(targets.get("debian-12"))
        root = buildroot.ensure(recipe, real_build.cache, mirror=archive.mirror,
                                security_mirror=getattr(archive, "security_mirror", None))
        tar = subprocess.Popen(["tar", "-C", str(root.path), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(["podman", "import", "-", "docker.io/library/debian:12"], stdin=tar.stdout,
                       env=full, check=True, capture_output=True, timeout=600)
        assert tar.wait() == 0
        yield env
    finally:
        subprocess.run(["podman", "system", "reset", "--force"], env=full, capture_output=True,
                       timeout=300)
        shutil.rmtree(work, ignore_errors=True)


def test_podman_builder_publishes_to_the_registry(real_build, published: Published,  # type: ignore[no-untyped-def]
                                                  podman_env: dict[str, str]) -> None:
    p = published
    location = p.registry.url("gpu/container-built")
    r = cli("-v", "build-driver", "--builder", "podman", "--os", real_build.os_name,
            "--driver", p.version, "--kernel", p.kernel, "--flavour", real_build.flavour,
            "--cache", str(real_build.cache), "--no-smoke-test", "--store", location,
            "--registry-auth", str(p.auth), "--ca-file", str(p.registry.ca), "--json", env=podman_env)
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout)
    assert out["compiled"] is False and out["pushed_index"].startswith("sha256:")
    assert out["artifact"].startswith("/store/")  # built inside the container, into its mount

    # The container's argv (logged with -v) names neither the registry nor its credentials.
    run_line = next(line for line in r.stderr.splitlines() if "podman run " in line)
    for secret in (str(p.auth), PASSWORD, p.registry.host, str(p.registry.ca)):
        assert secret not in run_line
    assert PASSWORD not in r.stderr + r.stdout
    assert not list((real_build.cache / "oci-publish").glob("container-*"))  # staging removed

    listed = cli("artifacts", "list", f"{location}@{out['pushed_index']}", "--registry-auth", str(p.auth),
                 "--ca-file", str(p.registry.ca), "--json")
    assert listed.returncode == 0, listed.stderr
    in_registry = {e["name"]: e for e in json.loads(listed.stdout)}
    assert set(in_registry) == {p.kmod.name, p.userspace.name}
    assert in_registry[p.userspace.name]["sha256"] == p.userspace.sha256  # reused from the cache
    # The kmod was packed in the container, by Debian 12's python3-zstandard (libzstd 1.5.4), not
    # the host's: the same inputs and the same tar inside, compressed by another zstd version.
    kmod = in_registry[p.kmod.name]
    assert kmod["input_digest"] == p.kmod.input_digest and kmod["vermagic"] == p.kmod.vermagic
    pulled = registry_get(p, f"blobs/sha256:{kmod['sha256']}", repo="gpu/container-built")
    assert hashlib.sha256(pulled).hexdigest() == kmod["sha256"]
    ours = (real_build.store / p.kmod.name).read_bytes()
    assert untar(pulled) == untar(ours)


def untar(blob: bytes) -> list[tuple[str, int, bytes]]:
    """(name, mode, content) of every member of a .tar.zst, in order."""
    import io
    import tarfile

    import zstandard

    raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(blob)).read()
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        return [(m.name, m.mode, tar.extractfile(m).read() if m.isfile() else b"")  # type: ignore[union-attr]
                for m in tar.getmembers()]
