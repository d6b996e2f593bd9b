"""Module signature trailers on real modules, and sign_modules' input checks (the real signing with the
kernel's sign-file runs in tests/slow/smoke/test_signing.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeprep.builder.signing import SIG_MAGIC, find_sign_file, has_signature, sign_modules, strip_signature
from nodeprep.errors import ArtifactError, InputError
from nodeprep.modinfo import parse_module


def test_strip_signature_of_a_debian_signed_module(data: Path) -> None:
    signed = (data / "vgem.ko").read_bytes()
    assert has_signature(signed)
    bare = strip_signature(signed)
    assert not has_signature(bare)
    assert len(signed) - len(bare) > 256  # PKCS#7 blob + struct + magic
    assert parse_module(bare, "vgem").field("name") == "vgem"  # still a valid module
    assert strip_signature(bare) is bare


def test_unsigned_module_is_left_alone(data: Path) -> None:
    raw = (data / "nvidia-peermem.ko").read_bytes()
    assert not has_signature(raw)
    assert strip_signature(raw) is raw


def test_corrupt_signature_is_refused() -> None:
    bogus = b"\x7fELF" + b"\0" * 8 + b"\0\0\0\0\0\0\0\0\xff\xff\xff\xff" + SIG_MAGIC
    with pytest.raises(ArtifactError, match="exceeds"):
        strip_signature(bogus)


def test_bad_inputs_are_input_errors(tmp_path: Path) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    key.write_text("k")
    with pytest.raises(InputError, match="--sign-hash: 'md5'"):
        sign_modules(tmp_path, tmp_path, key, cert, "md5")
    with pytest.raises(InputError, match=f"--sign-cert: {cert} does not exist"):
        sign_modules(tmp_path, tmp_path, key, cert)
    cert.write_text("c")
    with pytest.raises(InputError, match="no scripts/sign-file"):
        find_sign_file(tmp_path)
