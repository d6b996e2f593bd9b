"""Sign kernel modules for Secure Boot with the target kernel's own scripts/sign-file.

The key and certificate are only ever read on the build host (see docs/secure-boot.md): nodes get
signed modules and, through MOK enrolment, the public certificate, never the key. Signing must be the
last change to a module (stripping after signing destroys the signature); signing twice replaces the
old signature instead of stacking a second one. RSA PKCS#1 v1.5 signatures carry no timestamp, so the
same key and module give the same bytes.
"""

from __future__ import annotations

import logging
import os
import struct
from pathlib import Path
from typing import Any

from .. import runner
from ..errors import ArtifactError, InputError, NodeprepError
from ..modinfo import SIG_MAGIC

log = logging.getLogger(__name__)

SIG_STRUCT = struct.Struct(">BBBBB3xI")  # struct module_signature (12 bytes, sig_len big endian)
HASH_ALGOS = ("sha256", "sha384", "sha512")
INFO_FIELDS = ("signer", "sig_key", "sig_hashalgo")


def has_signature(data: bytes) -> bool:
    """True when the module image ends with an appended signature."""
    return data.endswith(SIG_MAGIC)


def strip_signature(data: bytes) -> bytes:
    """The module without its appended signature (unchanged when unsigned)."""
    if not has_signature(data):
        return data
    end = len(data) - len(SIG_MAGIC)
    if end < SIG_STRUCT.size:
        raise ArtifactError("truncated module signature")
    *_, sig_len = SIG_STRUCT.unpack_from(data, end - SIG_STRUCT.size)
    start = end - SIG_STRUCT.size - sig_len
    if start < 0:
        raise ArtifactError("module signature length exceeds the module")
    return data[:start]


def find_sign_file(headers_dir: Path) -> Path:
    """scripts/sign-file of the target kernel: `headers_dir` is the linux-headers-<release> tree (its
    `scripts` links into linux-kbuild-<ver>) or a directory the header packages were extracted into."""
    candidates = [headers_dir / "scripts" / "sign-file"]
    # A relative `scripts` link resolves only when linux-kbuild was extracted into the same root.
    for root in (headers_dir, *headers_dir.parents[:3]):
        candidates += sorted(root.glob("usr/lib/linux-kbuild-*/scripts/sign-file"))
        candidates += sorted(root.glob("usr/src/linux-headers-*/scripts/sign-file"))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise InputError(f"{headers_dir}: no scripts/sign-file (extract linux-headers-<release> together with "
                     "its linux-kbuild package)")


def _check_inputs(key: Path, cert: Path, hash_algo: str) -> None:
    if hash_algo not in HASH_ALGOS:
        raise InputError(f"--sign-hash: {hash_algo!r} is not one of {', '.join(HASH_ALGOS)}")
    for what, path in (("--sign-key", key), ("--sign-cert", cert)):
        if what == "--sign-key" and str(key).startswith("pkcs11:"):
            continue  # a key in a token/HSM: sign-file opens it through the OpenSSL pkcs11 engine
        if not path.is_file():
            raise InputError(f"{what}: {path} does not exist")
        if not os.access(path, os.R_OK):
            raise InputError(f"{what}: {path} is not readable")


def module_signature_info(path: Path) -> dict[str, str]:
    """signer / sig_key / sig_hashalgo as modinfo(8) shows them (empty strings when unsigned)."""
    info = {}
    for f in INFO_FIELDS:
        info[f] = runner.run(["modinfo", "-F", f, path]).stdout.strip()
    return info


def sign_modules(module_dir: Path, headers_dir: Path, key: Path, cert: Path,
                 hash_algo: str = "sha256") -> dict[str, Any]:
    """Sign every .ko under `module_dir` in place; returns manifest.extra["signing"]:
    {"signer", "sig_key", "hash", "modules": [names]}."""
    _check_inputs(key, cert, hash_algo)
    sign_file = find_sign_file(headers_dir)
    modules = sorted(module_dir.rglob("*.ko"))
    if not modules:
        raise InputError(f"{module_dir}: no kernel modules (*.ko) to sign")
    infos = []
    for ko in modules:
        data = ko.read_bytes()
        stripped = strip_signature(data)
        if stripped is not data:
            ko.write_bytes(stripped)
        runner.run([sign_file, hash_algo, key, cert, ko])
        if not has_signature(ko.read_bytes()):
            raise NodeprepError(f"{ko.name}: sign-file did not append a signature")
        infos.append(module_signature_info(ko))
    first = infos[0]
    if not first["signer"] or not first["sig_key"]:
        raise NodeprepError(f"{modules[0].name}: modinfo shows no signer after signing")
    for ko, info in zip(modules, infos, strict=True):
        if info != first:
            raise NodeprepError(f"{ko.name}: signature info {info} differs from {modules[0].name}'s {first}")
    log.info("signed %d modules (signer %r, key %s, %s)", len(modules), first["signer"], first["sig_key"],
             first["sig_hashalgo"])
    return {
        "signer": first["signer"],
        "sig_key": first["sig_key"],
        "hash": first["sig_hashalgo"] or hash_algo,
        "modules": [ko.relative_to(module_dir).as_posix() for ko in modules],
        "tool": "scripts/sign-file",
    }
