"""sha256 of files and bytes, and the canonical JSON that digests are taken of.

Hashing alone needs none of the artifact format (tarfile, zstandard): the many modules that only
hash a file import this one; nodeprep/artifact.py builds input digests and checks members with it.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

CHUNK = 1 << 20
SHA256_RE = re.compile(r"[0-9a-f]{64}")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical_json(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
