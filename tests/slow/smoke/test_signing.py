"""Real module signing with the target kernel's scripts/sign-file and a real openssl key, then real
boots with module.sig_enforce=1: unsigned and untrusted-key modules are rejected, told apart."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from nodeprep import runner
from nodeprep.artifact import extract
from nodeprep.builder.signing import has_signature, module_signature_info, sign_modules, strip_signature
from nodeprep.builder.smoke import smoke_test_modules

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def unsigned_dir(kmod: Path, kernel_release: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("kmod")
    extract(kmod, d)
    return d / "modules" / kernel_release


@pytest.fixture(scope="module")
def signed(unsigned_dir: Path, headers_dir: Path, signing_key: tuple[Path, Path],
           tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    d = tmp_path_factory.mktemp("signed") / "modules"
    shutil.copytree(unsigned_dir, d)
    key, cert = signing_key
    return d, sign_modules(d, headers_dir, key, cert)


def _serial(cert: Path) -> str:
    out = runner.run(["openssl", "x509", "-in", cert, "-noout", "-serial"]).stdout.strip()
    hexa = out.split("=", 1)[1]
    return ":".join(hexa[i:i + 2] for i in range(0, len(hexa), 2))


def test_signing_fills_modinfo(signed: tuple[Path, dict], unsigned_dir: Path,
                               signing_key: tuple[Path, Path]) -> None:
    d, info = signed
    _, cert = signing_key
    names = sorted(p.name for p in unsigned_dir.glob("*.ko"))
    assert info["modules"] == names and "nvidia.ko" in names
    assert info["signer"] == "nodeprep test module signing key"
    assert info["sig_key"] == _serial(cert)  # sign-file identifies the key by issuer + serial
    assert info["hash"] == "sha256"
    for name in names:
        fields = module_signature_info(d / name)
        assert fields == {"signer": "nodeprep test module signing key", "sig_key": _serial(cert),
                          "sig_hashalgo": "sha256"}
        assert module_signature_info(unsigned_dir / name)["signer"] == ""
        # the signature is appended: removing it gives back the unsigned module, byte for byte
        assert strip_signature((d / name).read_bytes()) == (unsigned_dir / name).read_bytes()


def test_resigning_replaces_the_signature_and_is_deterministic(
        signed: tuple[Path, dict], headers_dir: Path, signing_key: tuple[Path, Path],
        tmp_path: Path) -> None:
    src, _ = signed
    key, cert = signing_key
    d = tmp_path / "m"
    d.mkdir()
    shutil.copy(src / "nvidia-peermem.ko", d)
    info = sign_modules(d, headers_dir, key, cert, "sha512")
    assert info["hash"] == "sha512"
    again = (d / "nvidia-peermem.ko").read_bytes()
    assert has_signature(again) and not has_signature(strip_signature(again))  # one signature, not two
    assert strip_signature(again) == strip_signature((src / "nvidia-peermem.ko").read_bytes())
    sign_modules(d, headers_dir, key, cert, "sha512")
    assert (d / "nvidia-peermem.ko").read_bytes() == again


def test_sig_enforce_rejects_unsigned_and_untrusted_distinctly(
        unsigned_dir: Path, signed: tuple[Path, dict], kernel_release: str, archive, test_cache: Path,  # type: ignore
) -> None:
    unsigned = smoke_test_modules(unsigned_dir, kernel_release, archive=archive, cache=test_cache,
                                  sig_enforce=True)
    untrusted = smoke_test_modules(signed[0], kernel_release, archive=archive, cache=test_cache,
                                   sig_enforce=True)
    assert unsigned.verdict == untrusted.verdict == "FAIL"
    assert unsigned.reason.startswith("nvidia (module under test) failed to load: unsigned module rejected")
    assert untrusted.reason.startswith("nvidia (module under test) failed to load: signed with a key the "
                                       "kernel does not trust")
    assert "Loading of unsigned module is rejected" in unsigned.log_excerpt
    assert "Loading of module with unavailable key is rejected" in untrusted.log_excerpt
    assert unsigned.to_dict()["sig_enforce"] is True
    # the in-kernel dependencies (signed by Debian) still load under enforcement
    assert "insmod drm: ok" in unsigned.log_excerpt


def test_signed_modules_load_under_secure_boot_with_the_cert_enrolled(
        signed: tuple[Path, dict], signing_key: tuple[Path, Path], kernel_release: str, archive,  # type: ignore
        test_cache: Path) -> None:
    """As on a node that enrolled the certificate: OVMF with Secure Boot on, the kernel's own signer and
    our certificate in db; the kernel locks itself down and must still load the signed nvidia.ko."""
    _, cert = signing_key
    result = smoke_test_modules(signed[0], kernel_release, archive=archive, cache=test_cache,
                                trusted_cert=cert, timeout=240)
    assert result.verdict == "PASS", result.reason + "\n" + result.log_excerpt
    assert result.reason.endswith("under UEFI Secure Boot (lockdown: integrity)")
    lines = result.log_excerpt.splitlines()
    assert "secureboot: Secure boot enabled" in lines
    ours = "integrity: Loaded X.509 cert 'nodeprep test module signing key: "
    assert any(x.startswith(ours) for x in lines)
    assert "NVRM: No NVIDIA GPU found." in lines
    assert result.to_dict()["secure_boot"] is True and result.to_dict()["sig_enforce"] is True
