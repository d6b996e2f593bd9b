"""UEFI Secure Boot for the smoke test (OVMF): a variable store with the kernel's own signer and the
operator's certificate in db, so the kernel boots locked down and trusts the module signing key."""

from __future__ import annotations

import struct
import sys
import tempfile
from pathlib import Path

from .. import runner
from ..atomicfile import publish_file
from ..digests import sha256_bytes, sha256_file
from ..errors import ArtifactError, InputError, NodeprepError
from .kernelfetch import Kernel

OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.secboot.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")
SB_OWNER_GUID = "9f3b7b3c-5d8e-4b55-9a59-6e6f64657072"  # "nodeprep" owner of the db entries


def pe_signature(image: bytes) -> bytes:
    """The PKCS#7 (Authenticode) blob of a signed PE image, e.g. Debian's EFI-stub vmlinuz."""
    try:
        pe = struct.unpack_from("<I", image, 0x3C)[0]
        if image[pe:pe + 4] != b"PE\0\0":
            raise ValueError("no PE header")
        magic = struct.unpack_from("<H", image, pe + 24)[0]
        ddir = pe + 24 + (112 if magic == 0x20B else 96)
        off, size = struct.unpack_from("<II", image, ddir + 4 * 8)  # IMAGE_DIRECTORY_ENTRY_SECURITY
        if not off or not size:
            raise ValueError("not signed")
        length, _, kind = struct.unpack_from("<IHH", image, off)
        if kind != 2:  # WIN_CERT_TYPE_PKCS_SIGNED_DATA
            raise ValueError(f"certificate type {kind}")
        return image[off + 8:off + length]
    except (struct.error, ValueError) as e:
        raise ArtifactError(f"kernel image has no usable Authenticode signature ({e})") from None


def _virt_fw_vars() -> str:
    tool = Path(sys.executable).parent / "virt-fw-vars"
    found = str(tool) if tool.exists() else runner.which("virt-fw-vars")
    if not found:
        raise NodeprepError("virt-fw-vars not found: the Secure Boot smoke test needs the virt-firmware "
                            "Python package (scripts/deps/smoke.pip)")
    return found


def secure_boot_vars(kernel: Kernel, trusted_cert: Path, cache: Path) -> Path:
    """An OVMF variable store with Secure Boot on, a throw-away PK/KEK, and in db: the certificate that
    signed the kernel image (so OVMF boots it) and `trusted_cert` (the operator's module signing key;
    the kernel loads db into its platform keyring). Cached by content."""
    for f in (OVMF_CODE, OVMF_VARS):
        if not f.is_file():
            raise NodeprepError(f"{f} is missing: the Secure Boot smoke test needs the ovmf package")
    if not trusted_cert.is_file():
        raise InputError(f"--trust-cert: {trusted_cert} does not exist")
    key = sha256_bytes(f"{sha256_file(kernel.vmlinuz)} {sha256_file(trusted_cert)} "
                       f"{sha256_file(OVMF_VARS)}".encode())[:16]
    dest = cache / "secureboot" / f"vars-{kernel.release}-{key}.fd"
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        p7 = Path(tmp) / "vmlinuz.p7"
        p7.write_bytes(pe_signature(kernel.vmlinuz.read_bytes()))
        signer = Path(tmp) / "kernel-signer.pem"
        runner.run(["openssl", "pkcs7", "-inform", "DER", "-in", p7, "-print_certs", "-out", signer])
        out = Path(tmp) / "vars.fd"
        runner.run([_virt_fw_vars(), "--input", OVMF_VARS, "--output", out,
                    "--enroll-generate", "nodeprep smoke test", "--no-microsoft",
                    "--add-db", SB_OWNER_GUID, signer, "--add-db", SB_OWNER_GUID, trusted_cert,
                    "--secure-boot"])
        publish_file(out, dest)
    return dest
