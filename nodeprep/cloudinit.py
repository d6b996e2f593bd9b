"""cloud-init user-data for a GPU node: a `#cloud-config` that writes the node profile, the bootstrap
token (0600) and the CA hashes, installs nodeprep from the artifact store (sha256-checked) or the
package index, and runs `nodeprep bootstrap --profile /etc/nodeprep/node.yaml`.

The cloud-config is built as a dict and dumped with yaml; nothing is templated by hand. It is kept
under a size limit (AWS: 16384 bytes of raw user-data) by, in order: plain YAML, gzip+base64
write_files contents (`encoding: gz+b64`), gzip of the whole user-data (cloud-init decompresses it).
With operator parts (or `fmt="mime"`) the result is MIME multipart with `text/cloud-config` parts
carrying `merge_how`, so `runcmd`/`write_files`/`packages` lists append instead of replacing.
"""

from __future__ import annotations

import base64
import email
import gzip
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import yaml

from . import __version__
from .atomicfile import atomic_write
from .digests import sha256_file
from .errors import InputError
from .join.token import read_token_file
from .profile.fields import field_by_path
from .stores.auth import check_private
from .yamlinput import decode_text, parse_yaml, read_input_bytes

log = logging.getLogger(__name__)

AWS_USER_DATA_LIMIT = 16384  # "User data is limited to 16 KB, in raw form, before it is base64-encoded"
PROFILE_PATH = "/etc/nodeprep/node.yaml"
CA_HASHES_PATH = "/etc/nodeprep/ca-cert-hashes"
DEFAULT_TOKEN_PATH = "/etc/nodeprep/bootstrap-token"
INSTALLER_PATH = "/usr/local/lib/nodeprep/install-nodeprep"
UNIT_NAME = "nodeprep-bootstrap.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
NODEPREP_BIN = "/usr/local/bin/nodeprep"
TOOLS_DIR = "tools"  # wheels published in the artifact store: <store>/tools/nodeprep-<ver>-py3-none-any.whl
GZIP_MIN = 256  # write_files contents shorter than this stay plain
GZIP_MTIME = 0  # deterministic output

# list(append): later parts' runcmd/write_files/packages add to ours; dict(no_replace,recurse_list):
# an operator part cannot silently replace keys we set, nested lists append too.
MERGE_HOW: list[dict[str, Any]] = [
    {"name": "list", "settings": ["append"]},
    {"name": "dict", "settings": ["no_replace", "recurse_list"]},
    {"name": "str", "settings": []},
]
MERGE_TYPE_HEADER = "list(append)+dict(no_replace,recurse_list)+str()"

CA_HASH_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
SAFE_ARG_RE = re.compile(r"^[A-Za-z0-9._~:/?#\[\]@!$&'()*+,;=%<>=-]+$")

# Distribution packages the node needs before nodeprep can run. Store mode installs nodeprep's
# wheel without dependencies into a venv that sees the system site-packages, so its dependencies
# come from the distribution; index mode lets pip bring them.
OS_PACKAGES: dict[str, dict[str, tuple[str, ...]]] = {
    "debian": {
        "base": ("python3", "python3-venv", "ca-certificates", "kmod", "zstd"),
        "deps": ("python3-click", "python3-yaml", "python3-requests", "python3-zstandard", "python3-jinja2",
                 "python3-jsonschema", "python3-tomli-w"),
    },
    "rhel": {
        "base": ("python3.11", "python3.11-pip", "ca-certificates", "kmod", "zstd"),
        "deps": (),  # not packaged for python3.11 on RHEL 9: use --nodeprep-from index
    },
}
OS_PYTHON = {"debian": "python3", "rhel": "python3.11"}

Format = Literal["auto", "cloud-config", "mime"]
OsFamily = Literal["debian", "rhel"]  # the keys of OS_PACKAGES and OS_PYTHON

# The first-boot installer, a package data file (shellchecked and run as a script by the tests). Static
# text (no templating): its parameters arrive as argv in runcmd.
INSTALLER_SCRIPT = Path(__file__).parent / "data" / "install-nodeprep.sh"


def installer() -> str:
    """The installer's text (read when rendering: importing this module reads no file)."""
    return INSTALLER_SCRIPT.read_text()


# Reruns bootstrap at every boot until it has succeeded once (a rerun after success does nothing):
# runcmd runs only at the first boot, so a bring-up interrupted by a store outage or a reboot
# resumes here. Bad input (exit 2) is not retried. Static text.
UNIT = """[Unit]
Description=nodeprep bootstrap (driver, labels, container runtime, join); resumes after a failure
After=network-online.target
Wants=network-online.target
ConditionPathExists=/usr/local/bin/nodeprep
ConditionPathExists=/etc/nodeprep/node.yaml

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/bin/nodeprep bootstrap --profile /etc/nodeprep/node.yaml
Restart=on-failure
RestartSec=30
RestartPreventExitStatus=2

[Install]
WantedBy=multi-user.target
"""


@dataclass(frozen=True)
class NodeprepSource:
    """Where the node gets nodeprep: `store` (wheel URL + sha256) or `index` (a pip requirement)."""

    mode: Literal["store", "index"]
    url: str | None = None
    sha256: str | None = None
    requirement: str | None = None

    def installer_args(self) -> list[str]:
        if self.mode == "store":
            assert self.url and self.sha256
            return ["store", self.url, self.sha256]
        assert self.requirement
        return ["index", self.requirement]


@dataclass(frozen=True)
class UserDataSpec:
    """Everything the user-data is made of (already validated)."""

    profile_text: str
    source: NodeprepSource
    token: str | None = None
    token_path: str = DEFAULT_TOKEN_PATH
    ca_cert_hashes: tuple[str, ...] = ()
    os_family: OsFamily = "debian"
    package_update: bool = True
    extra_parts: tuple[tuple[str, str], ...] = ()  # (filename, content) appended as MIME parts
    # (path on the node, content, permissions): the registry credentials file (0600), the store's CA
    store_files: tuple[tuple[str, str, str], ...] = ()

    @property
    def secret(self) -> bool:
        """The user-data carries a secret (token or registry credentials): written 0600."""
        return self.token is not None or any(mode == "0600" for _, _, mode in self.store_files)


@dataclass(frozen=True)
class UserData:
    data: bytes
    format: str  # "cloud-config" | "cloud-config+gz+b64" | "mime" | ... with "+gzip" when compressed whole
    size: int
    limit: int
    notes: tuple[str, ...] = field(default_factory=tuple)


# ---------------------------------------------------------------------------------------------
# Inputs


def read_token(path: Path) -> str:
    """The bootstrap token from `path` (one line `abcdef.0123456789abcdef`); never logged. The same
    check as `join` (nodeprep.join.token.read_token_file): a regular file, not group/other-readable."""
    return read_token_file(path, field="--token-file").value


def check_ca_hashes(hashes: Sequence[str]) -> tuple[str, ...]:
    bad = [h for h in hashes if not CA_HASH_RE.match(h)]
    if bad:
        raise InputError(f"--ca-cert-hash: {bad[0]!r} is not sha256:<64 hex digits>")
    return tuple(dict.fromkeys(hashes))


def wheel_name(version: str = __version__) -> str:
    return f"nodeprep-{version}-py3-none-any.whl"


def store_source(store: str, *, wheel: Path | None = None, version: str = __version__) -> NodeprepSource:
    """The store-mode source: the wheel's URL on the node and its sha256, taken from `wheel` (a local
    copy of the published file) or from `<store>/tools/` when the store is a local directory."""
    if store.startswith(("oci://", "oci+http://")):
        raise InputError(f"driver.store {store!r} is an OCI registry, which does not serve the nodeprep "
                         f"wheel: use --nodeprep-from index")
    store_s = str(store).rstrip("/")
    local_store = Path(store_s[len("file://"):]) if store_s.startswith("file://") else Path(store_s)
    if wheel is None:
        if "://" in store_s and not store_s.startswith("file://"):
            raise InputError(f"driver.store {store!r} is remote: pass --nodeprep-wheel FILE (the wheel "
                             f"published at {store_s}/{TOOLS_DIR}/) so its sha256 can go into the user-data",
                             hint="build it from a checkout with `.venv/bin/python -m pip wheel --no-deps "
                             "--no-build-isolation --wheel-dir dist .` (docs/cloud.md, 'Try it')")
        wheel = local_store / TOOLS_DIR / wheel_name(version)
        if not wheel.is_file():
            raise InputError(f"{wheel}: no nodeprep wheel in the store (publish one with "
                             f"`nodeprep cloud-init --publish-wheel FILE`, or use --nodeprep-from index)")
    elif not wheel.is_file():
        raise InputError(f"--nodeprep-wheel: {wheel}: no such file")
    if not re.match(r"^nodeprep-[^-]+-py3-none-any\.whl$", wheel.name):
        raise InputError(f"{wheel}: not a nodeprep wheel (nodeprep-<version>-py3-none-any.whl)")
    url = f"{store_s}/{TOOLS_DIR}/{wheel.name}"
    if not SAFE_ARG_RE.match(url):
        raise InputError(f"driver.store: {store!r} contains characters not allowed in a URL")
    return NodeprepSource("store", url=url, sha256=sha256_file(wheel))


def index_source(requirement: str | None = None) -> NodeprepSource:
    req = requirement or f"nodeprep=={__version__}"
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?([<>=!~]=?[A-Za-z0-9.*+-]+)?$", req):
        raise InputError(f"--nodeprep-requirement: {req!r} is not a simple pip requirement")
    return NodeprepSource("index", requirement=req)


def published_wheel(store: Path, wheel: Path) -> Path:
    """Where publish_wheel puts `wheel` in `store` (checked, nothing written: `--check`)."""
    if not re.match(r"^nodeprep-[^-]+-py3-none-any\.whl$", wheel.name) or not wheel.is_file():
        raise InputError(f"{wheel}: not a nodeprep wheel file (nodeprep-<version>-py3-none-any.whl)")
    return store / TOOLS_DIR / wheel.name


def publish_wheel(store: Path, wheel: Path) -> Path:
    """Copy a nodeprep wheel into `<store>/tools/` (atomically) and return its path there."""
    dest = published_wheel(store, wheel)
    atomic_write(dest, wheel.read_bytes(), mode=0o644)
    return dest


def parse_part(path: Path) -> tuple[str, str]:
    """An operator's extra part: a `#cloud-config` or a `#!` script."""
    source = f"--part {path}"
    text = decode_text(read_input_bytes(path, source=source), source=source)
    first = text.split("\n", 1)[0].strip()
    if first != "#cloud-config" and not first.startswith("#!"):
        raise InputError(f"--part {path}: first line must be '#cloud-config' or a '#!' interpreter line")
    if first == "#cloud-config":
        data = parse_yaml(text, source=source).data
        if data is not None and not isinstance(data, dict):
            raise InputError(f"--part {path}: a cloud-config must be a mapping")
    return path.name, text


# ---------------------------------------------------------------------------------------------
# Building


def cloud_config(spec: UserDataSpec) -> dict[str, Any]:
    """The cloud-config dict (plain contents; `fit` compresses when needed)."""
    files: list[dict[str, Any]] = [
        {"path": PROFILE_PATH, "content": spec.profile_text, "owner": "root:root", "permissions": "0644"},
    ]
    if spec.token is not None:
        files.append({"path": spec.token_path, "content": spec.token + "\n", "owner": "root:root",
                      "permissions": "0600"})
    for path, content, mode in spec.store_files:
        files.append({"path": path, "content": content, "owner": "root:root", "permissions": mode})
    if spec.ca_cert_hashes:
        files.append({"path": CA_HASHES_PATH, "content": "".join(h + "\n" for h in spec.ca_cert_hashes),
                      "owner": "root:root", "permissions": "0644"})
    files.append({"path": INSTALLER_PATH, "content": installer(), "owner": "root:root",
                  "permissions": "0755"})
    files.append({"path": UNIT_PATH, "content": UNIT, "owner": "root:root", "permissions": "0644"})
    pkgs = OS_PACKAGES[spec.os_family]
    packages = list(pkgs["base"]) + (list(pkgs["deps"]) if spec.source.mode == "store" else [])
    return {
        "package_update": spec.package_update,
        "packages": packages,
        "write_files": files,
        "runcmd": [
            [INSTALLER_PATH, OS_PYTHON[spec.os_family], *spec.source.installer_args()],
            [NODEPREP_BIN, "bootstrap", "--profile", PROFILE_PATH],
            ["systemctl", "enable", UNIT_NAME],
        ],
    }


class _Dumper(yaml.SafeDumper):
    """SafeDumper that writes multi-line strings as literal blocks (readable files in the user-data)."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if "\n" in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_Dumper.add_representer(str, _str_representer)


def dump(config: dict[str, Any]) -> str:
    """`#cloud-config` + YAML (key order kept, block style, multi-line strings as literal blocks)."""
    return "#cloud-config\n" + yaml.dump(config, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                                         allow_unicode=True, width=1 << 16)


def _gz_b64(text: str) -> str:
    return base64.b64encode(gzip.compress(text.encode(), compresslevel=9, mtime=GZIP_MTIME)).decode()


def compress_files(config: dict[str, Any], min_size: int = GZIP_MIN) -> dict[str, Any]:
    """A copy of `config` whose write_files contents of at least `min_size` bytes are gz+b64."""
    out = dict(config)
    files = []
    for f in config.get("write_files", []):
        content = f.get("content", "")
        if "encoding" not in f and len(content.encode()) >= min_size:
            packed = _gz_b64(content)
            if len(packed) < len(content.encode()):
                f = {**f, "content": packed, "encoding": "gz+b64"}
        files.append(f)
    out["write_files"] = files
    return out


def mime(parts: Sequence[tuple[str, str]]) -> str:
    """MIME multipart/mixed user-data from (filename, text) parts; cloud-config parts carry the
    merge type so later parts append to lists. Deterministic boundary."""
    outer = MIMEMultipart(boundary="==NODEPREP-BOUNDARY==")
    for filename, text in parts:
        first = text.split("\n", 1)[0].strip()
        subtype = "cloud-config" if first == "#cloud-config" else "x-shellscript"
        part = MIMEText(text, subtype, "us-ascii" if text.isascii() else "utf-8")
        part.add_header("Content-Disposition", "attachment", filename=filename)
        if subtype == "cloud-config":
            part.add_header("Merge-Type", MERGE_TYPE_HEADER)
        outer.attach(part)
    return outer.as_string(policy=outer.policy.clone(linesep="\n"))


def _gzip_whole(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=9, mtime=GZIP_MTIME)


def render(spec: UserDataSpec, *, fmt: Format = "auto", limit: int = AWS_USER_DATA_LIMIT,
           allow_gzip: bool = True) -> UserData:
    """User-data for `spec` that fits in `limit` bytes, trying the smallest change first."""
    config = cloud_config(spec)
    use_mime = fmt == "mime" or bool(spec.extra_parts)
    if fmt == "cloud-config" and spec.extra_parts:
        raise InputError("--format cloud-config cannot carry extra --part files (use mime or auto)")

    def encode(cfg: dict[str, Any]) -> bytes:
        if not use_mime:
            return dump(cfg).encode()
        ours = dump({**cfg, "merge_how": MERGE_HOW})
        return mime([("nodeprep.cfg", ours), *spec.extra_parts]).encode()

    kind = "mime" if use_mime else "cloud-config"
    tried: list[str] = []
    candidates: list[tuple[str, bytes]] = [(kind, encode(config))]
    candidates.append((kind + "+gz+b64", encode(compress_files(config))))
    if allow_gzip:
        candidates.append((kind + "+gz+b64+gzip", _gzip_whole(candidates[-1][1])))
    for name, data in candidates:
        tried.append(f"{name}: {len(data)} bytes")
        if len(data) <= limit:
            log.debug("user-data %s: %d bytes (limit %d)", name, len(data), limit)
            return UserData(data=data, format=name, size=len(data), limit=limit, notes=tuple(tried))
    largest = max(config["write_files"], key=lambda f: len(f["content"].encode()))
    raise InputError(
        f"user-data does not fit in {limit} bytes even compressed ({'; '.join(tried)})",
        hint=f"largest file: {largest['path']} ({len(largest['content'].encode())} bytes); shrink the "
             f"profile or the --part files, or raise --limit for a cloud that allows more "
             f"(GCE 256 KiB, Azure 64 KiB)",
    )


# ---------------------------------------------------------------------------------------------
# Reading back (tests, `--check`): parts and decoded files


def unpack(data: bytes) -> list[tuple[str, str]]:
    """(content type, text) of every part of `data` (gzip and MIME undone)."""
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    text = data.decode()
    if not text.startswith("Content-Type: multipart/"):
        return [("text/cloud-config", text)]
    msg = email.message_from_string(text)
    out = []
    for part in msg.walk():
        if part.is_multipart():
            continue
        payload = part.get_payload(decode=True)
        assert isinstance(payload, bytes)
        out.append((part.get_content_type(), payload.decode()))
    return out


def decoded_files(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """write_files by path with their contents decoded (gz+b64, b64)."""
    out: dict[str, dict[str, Any]] = {}
    for f in config.get("write_files", []):
        content = f.get("content", "")
        enc = f.get("encoding", "text/plain")
        if enc in ("gz+b64", "gzip+base64", "gz+base64", "gzip+b64"):
            content = gzip.decompress(base64.b64decode(content)).decode()
        elif enc in ("b64", "base64"):
            content = base64.b64decode(content).decode()
        out[f["path"]] = {**f, "content": content}
    return out


def store_files(driver: Any, *, registry_auth: Path | None, ca_file: Path | None
                ) -> tuple[tuple[str, str, str], ...]:
    """write_files entries for the registry credentials (0600, at driver.registry_auth) and the
    store's CA (0644, at driver.ca_file), read from local files."""
    out: list[tuple[str, str, str]] = []
    for given, field_name, mode in ((registry_auth, "registry_auth", "0600"), (ca_file, "ca_file", "0644")):
        if given is None:
            continue
        flag = field_by_path(f"driver.{field_name}").flag or field_name
        dest = getattr(driver, field_name)
        if not dest:
            raise InputError(f"{flag}: the profile's driver.{field_name} is not set (where the file goes "
                             f"on the node)")
        if mode == "0600":
            check_private(given, flag)
        try:
            content = given.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"{flag}: {given}: cannot read ({type(e).__name__})") from None
        out.append((dest, content, mode))
    return tuple(out)


def token_path_for(cluster: Any) -> str:
    """Where the profile's cluster section expects its token file (absolute path)."""
    raw = getattr(cluster, "token_file", None) if cluster is not None else None
    path = str(raw) if raw else DEFAULT_TOKEN_PATH
    if not PurePosixPath(path).is_absolute():
        raise InputError(f"cluster.token_file: {path!r} must be an absolute path on the node")
    return path
