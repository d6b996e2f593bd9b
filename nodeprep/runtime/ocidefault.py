"""containerd's default OCI spec (what `ctr oci spec` prints), computed from the node's containerd
version instead of running the node's `ctr`.

The spec is a pure function of the containerd release (oci.populateDefaultUnixSpec): nodeprep ships
it as data (nodeprep/data/containerd-default-spec.json, one row per change from 1.6.0 on) and picks
the row by the version. The version is read as data: the installed `containerd` or `containerd.io`
package in ROOT/var/lib/dpkg/status, resolved beneath the root and read bounded; on the running
system (`--root /`) without such a package, the host's own `containerd --version` (PATH, a host
binary). Nothing under an image's root is ever run (docs/join.md, *The CUDA gate*).
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import Any

from .. import runner
from ..sysfs import UnsafeFile, read_bytes
from .files import under

DATA = Path(__file__).resolve().parents[1] / "data" / "containerd-default-spec.json"
DPKG_STATUS = "/var/lib/dpkg/status"
PACKAGES = ("containerd", "containerd.io")  # Debian/Ubuntu's, Docker's
MAX_STATUS = 64 << 20  # a real status file is a few MiB
Version = tuple[int, int, int]


def parse_version(text: str) -> Version | None:
    """(major, minor, patch) of a containerd version string (`1.7.24~ds1-6`, `2:1.6.20`, `v2.1.9`)."""
    m = re.match(r"v?(\d+)\.(\d+)\.(\d+)", text.strip().split(":", 1)[-1])
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def dpkg_version(status: str) -> str | None:
    """The Version of the installed containerd package in a dpkg status file's text (pure)."""
    for stanza in re.split(r"\n\s*\n", status):
        fields = dict(re.findall(r"(?m)^([A-Za-z-]+):[ \t]*(.*)$", stanza))
        if fields.get("Package") in PACKAGES and fields.get("Status", "").endswith(" installed"):
            return fields.get("Version") or None
    return None


def _table() -> dict[str, Any]:
    return dict(json.loads(DATA.read_text(encoding="utf-8")))


def known_releases() -> str:
    """The releases the data covers, for messages: `1.6.0 up to 2.4.0`."""
    table = _table()
    return f"{table['releases'][0]['from']} up to {table['until']}"


def spec_for(version: Version) -> dict[str, Any] | None:
    """`ctr oci spec` of containerd `version` (pure, from the data); None outside the known releases."""
    table = _table()
    rows = [r for r in table["releases"] if (parse_version(r["from"]) or (0, 0, 0)) <= version]
    if not rows or version >= (parse_version(table["until"]) or (0, 0, 0)):
        return None
    row = rows[-1]
    spec: dict[str, Any] = copy.deepcopy(table["spec"])
    spec["ociVersion"] = row["ociVersion"]
    spec["linux"]["maskedPaths"] = list(row["maskedPaths"])
    if row.get("inheritable"):
        caps = spec["process"]["capabilities"]
        caps["inheritable"] = list(caps["bounding"])
    return spec


def node_version(root: Path) -> tuple[str | None, str]:
    """(containerd version string, where it came from) of the node at `root`, or (None, why not).
    Read from the root's dpkg status; on the running system also the host's `containerd --version`."""
    where = f"{DPKG_STATUS} under {root}" if os.path.realpath(root) != "/" else DPKG_STATUS
    try:
        text = read_bytes(under(root, DPKG_STATUS), limit=MAX_STATUS).decode("utf-8", "replace")
    except FileNotFoundError:
        text = ""
    except (UnsafeFile, OSError) as e:
        return None, f"{where}: {e.strerror or e}"
    found = dpkg_version(text)
    if found is not None:
        return found, f"package in {where}"
    if os.path.realpath(root) == "/" and runner.which("containerd"):
        try:  # the host's own binary: the host is trusted
            words = runner.run(["containerd", "--version"], timeout=10, check=False).stdout.split()
        except Exception:  # noqa: BLE001 - a version probe only decides a warning
            words = []
        if len(words) >= 3 and parse_version(words[2]):
            return words[2], "containerd --version"
        why = "and `containerd --version` said no version"
        return None, f"no {' or '.join(PACKAGES)} package in {where}, {why}"
    return None, f"no {' or '.join(PACKAGES)} package in {where}"
