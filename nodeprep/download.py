"""HTTP(S)/file downloads with retries, resume (Range) and sha256 verification.

Used for NVIDIA .run installers (build side) and for artifact stores (node side). The file only
appears at `dest` after its checksum matched; a partial download is kept as `<dest>.part` and
resumed on the next try.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlparse

from .errors import ChecksumError, InputError, NetworkError
from .urls import redact_url

log = logging.getLogger(__name__)

CHUNK = 1 << 20
Progress = Callable[[int, int | None], None]  # (bytes done, total or None)


def is_url(location: str) -> bool:
    return urlparse(location).scheme in ("http", "https", "file")


def local_path(location: str) -> Path | None:
    """The filesystem path for a plain path or file:// URL; None for http(s)."""
    parsed = urlparse(location)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme in ("http", "https"):
        return None
    return Path(location)


def fetch_bytes(url: str, *, timeout: float = 30, retries: int = 3) -> bytes:
    """Small documents (store index). file:// and plain paths are read directly."""
    path = local_path(url)
    if path is not None:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise InputError(f"{path}: not found") from None
    import requests  # imported on first network use: it costs ~50 ms, local stores never need it

    last: Exception | None = None
    for attempt in range(retries):
        try:
            resp = requests.get(url, timeout=timeout)
            if resp.status_code == 404:
                raise InputError(f"{redact_url(url)}: not found (HTTP 404)")
            if resp.status_code >= 500:
                raise requests.HTTPError(f"HTTP {resp.status_code}")
            resp.raise_for_status()
            return resp.content
        except (requests.ConnectionError, requests.Timeout, requests.HTTPError) as e:
            last = e
            time.sleep(min(2**attempt * 0.5, 5))
    raise NetworkError(redact_url(f"{url}: unreachable after {retries} tries ({last})"))


def download(
    url: str,
    dest: Path,
    *,
    sha256: str,
    timeout: float = 30,
    retries: int = 5,
    progress: Progress | None = None,
) -> Path:
    """Download `url` to `dest`, resuming a previous `.part`, and verify `sha256` before the
    final rename. An existing `dest` with the right checksum is reused without a request."""
    sha256 = sha256.lower()
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise InputError(f"--sha256: {sha256!r} is not a sha256 hex digest (64 hex digits)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists() and _sha256(dest) == sha256:
        return dest
    part = dest.with_name(dest.name + ".part")
    src = local_path(url)
    if src is not None:
        if not src.is_file():
            raise InputError(f"{src}: not found")
        shutil.copyfile(src, part)
    else:
        _http_download(url, part, timeout=timeout, retries=retries, progress=progress)
    actual = _sha256(part)
    if actual != sha256:
        part.unlink(missing_ok=True)
        raise ChecksumError(f"{redact_url(url)}: sha256 {actual} does not match the expected {sha256}")
    os.replace(part, dest)
    return dest


def _http_download(url: str, part: Path, *, timeout: float, retries: int, progress: Progress | None) -> None:
    import requests

    last: Exception | None = None
    for attempt in range(retries):
        have = part.stat().st_size if part.exists() else 0
        headers = {"Range": f"bytes={have}-"} if have else {}
        try:
            with requests.get(url, headers=headers, stream=True, timeout=timeout) as resp:
                if resp.status_code == 416:  # already complete
                    return
                if resp.status_code == 404:
                    raise InputError(f"{redact_url(url)}: not found (HTTP 404)")
                if resp.status_code >= 400:
                    raise requests.HTTPError(f"HTTP {resp.status_code}")
                if have and resp.status_code != 206:
                    have = 0  # server ignored Range: start over
                total = resp.headers.get("Content-Length")
                total_n = int(total) + have if total and total.isdigit() else None
                with open(part, "ab" if have else "wb") as f:
                    done = have
                    for chunk in resp.iter_content(CHUNK):
                        f.write(chunk)
                        done += len(chunk)
                        if progress:
                            progress(done, total_n)
                if total_n is not None and part.stat().st_size < total_n:
                    raise requests.ConnectionError("connection closed before the end of the body")
                return
        except (requests.ConnectionError, requests.Timeout, requests.HTTPError,
                requests.exceptions.ChunkedEncodingError) as e:
            last = e
            log.info("download of %s interrupted (%s); retrying", redact_url(url), redact_url(str(e)))
            time.sleep(min(2**attempt * 0.5, 5))
    raise NetworkError(redact_url(f"{url}: download failed after {retries} tries ({last})"))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()
