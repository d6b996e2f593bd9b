"""Fixtures for the real smoke tier: the kmod artifact under test, the Debian archive, the target
kernel's sign-file, and a throw-away signing key made with openssl as the kernel's certs/x509.genkey
does."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from nodeprep import runner
from nodeprep.artifact import read_manifest

X509_GENKEY = """\
[ req ]
default_bits = 2048
distinguished_name = req_distinguished_name
prompt = no
string_mask = utf8only
x509_extensions = myexts

[ req_distinguished_name ]
O = nodeprep tests
CN = nodeprep test module signing key

[ myexts ]
basicConstraints=critical,CA:FALSE
keyUsage=digitalSignature
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
"""


@pytest.fixture(scope="session")
def kmod(request: pytest.FixtureRequest) -> Path:
    """The kmod artifact of this run's real driver build (tests/support/realbuild.py), or the artifact
    NODEPREP_SMOKE_KMOD names (to smoke-test any built artifact with this suite)."""
    given = os.environ.get("NODEPREP_SMOKE_KMOD")
    if given:
        return Path(given)
    real_build = request.getfixturevalue("real_build")
    return Path(real_build.kmod)


@pytest.fixture(scope="session")
def kernel_release(kmod: Path) -> str:
    release = read_manifest(kmod).kernel_release
    assert release
    return release


@pytest.fixture(scope="session")
def archive(test_cache: Path):  # type: ignore[no-untyped-def]
    from nodeprep.sources.debian import DebianArchive

    return DebianArchive(test_cache)


@pytest.fixture(scope="session")
def other_kernel(archive, kernel_release: str) -> str:  # type: ignore[no-untyped-def]
    """The oldest Debian 12 6.1 kernel the archive still serves that is not the build's."""
    flavour = kernel_release.rsplit("-", 1)[-1]
    names = archive.packages(rf"^linux-image-6\.1\.0-[0-9]+-{flavour}$")
    releases = [n.removeprefix("linux-image-") for n in names]
    others = sorted((r for r in releases if r != kernel_release), key=lambda r: int(r.split("-")[1]))
    if not others:
        pytest.fail(f"the archive serves no 6.1 kernel other than {kernel_release}: {releases}")
    return others[0]


@pytest.fixture(scope="session")
def headers_dir(archive, kernel_release: str, test_cache: Path) -> Path:  # type: ignore[no-untyped-def]
    """linux-headers-<release> extracted with its linux-kbuild package (scripts/sign-file)."""
    root = test_cache / "smoke" / f"headers-{kernel_release}"
    tree = root / "usr" / "src" / f"linux-headers-{kernel_release}"
    if not (root / ".complete").exists():
        deb = archive.download(f"linux-headers-{kernel_release}")
        archive.extract(deb, root)
        depends = archive.info(f"linux-headers-{kernel_release}").get("Depends", "")
        kbuild = re.search(r"linux-kbuild-[0-9.]+", depends)
        assert kbuild, f"linux-headers-{kernel_release} names no linux-kbuild package: {depends}"
        archive.extract(archive.download(kbuild.group(0)), root)
        (root / ".complete").touch()
    return tree


@pytest.fixture(scope="session")
def signing_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(private key, certificate) generated with openssl like the kernel's certs/x509.genkey."""
    d = tmp_path_factory.mktemp("signing-key")
    (d / "x509.genkey").write_text(X509_GENKEY)
    runner.run(["openssl", "req", "-new", "-nodes", "-utf8", "-sha256", "-days", "3650", "-batch", "-x509",
                "-config", d / "x509.genkey", "-outform", "PEM", "-out", d / "cert.pem",
                "-keyout", d / "key.pem"])
    os.chmod(d / "key.pem", 0o600)
    return d / "key.pem", d / "cert.pem"
