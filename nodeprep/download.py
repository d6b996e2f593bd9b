"""HTTP(S)/file downloads that survive a misbehaving server, with sha256 verification.

Used for NVIDIA .run installers (build side) and for artifact stores, directory/http and OCI
registry alike (node side). The file only appears at `dest` after its checksum matched; a partial
download is kept as `<dest>.part` and resumed with a Range request, on the next attempt and on the
next run.

What a `Policy` bounds (all injectable, so tests run without real waiting):
- attempts without progress in a row (an attempt that received bytes resets the count);
- the wait between attempts: exponential backoff with jitter, capped, `Retry-After` honoured up to
  the cap;
- a stall: no byte for `stall_timeout` seconds fails the attempt (the socket read timeout);
- the whole transfer: `deadline` seconds of wall clock including waits (each attempt's socket
  timeouts come from the time left, and a watchdog shuts its sockets when it runs out, so headers
  or a body that trickle in cannot outlast it), and `max_bytes` received in all.
The NODEPREP_FETCH_* variables set these for every store kind alike (`Policy.from_env`).

A URL is checked before anything connects to it, and so is every redirect hop (an http(s) URL
without credentials; plain http only to loopback or with `insecure_http`: nodeprep/urls.py,
nodeprep/stores/redirects.py).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import random
import re
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from .atomicfile import publish_file
from .digests import sha256_file
from .errors import ChecksumError, InputError, NetworkError
from .stores import redirects
from .urls import check_transport, redact_url

log = logging.getLogger(__name__)

CHUNK = 1 << 20
# Bytes per read of a response body; the deadline and byte cap are checked between reads. The body
# is read into one buffer of this size, reused for every read (_iter_body): a new 1 MiB object per
# read, as requests' iter_content makes, costs page faults whenever glibc hands such a block back
# to the kernel, and 32 nodes fetching at once spent up to twice the CPU per GiB on it
# (bench/store.py; docs/fleet.md). A read fills the whole buffer (several socket reads when the
# bytes come slower than the node takes them) before they are hashed and written, so the buffer is
# kept small enough for those bytes to still be in the CPU's cache: with 1 MiB, 32 nodes fetching
# at once on two cores spent 0.3-0.6 CPU s/GiB more in the kernel, copying cold bytes into the page
# cache; 512 KiB costs what a bare socket reader costs, and 128 KiB costs more in per-read overhead.
READ_CHUNK = 512 << 10
Progress = Callable[[int, int | None], None]  # (bytes done, total or None)
# Opens one streaming GET: (extra headers, (connect, read) timeout) -> requests.Response
Opener = Callable[[dict[str, str], tuple[float, float]], Any]
RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
ENV_PREFIX = "NODEPREP_FETCH_"


@dataclass(frozen=True)
class Policy:
    """Bounds of one transfer; see the module docstring. `from_env` reads NODEPREP_FETCH_*."""

    attempts: int = 6
    backoff: float = 0.5
    max_backoff: float = 10.0
    jitter: float = 0.5  # each wait is backoff * (1 - jitter * U[0,1))
    connect_timeout: float = 10.0
    stall_timeout: float = 30.0
    deadline: float = 1800.0
    max_bytes: int | None = None  # None: 2 x the expected size + 1 MiB, or 16 GiB when unknown
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False)
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)
    rand: Callable[[], float] = field(default=random.random, compare=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Policy:
        """Defaults, then NODEPREP_FETCH_ATTEMPTS/BACKOFF/MAX_BACKOFF/STALL_TIMEOUT/DEADLINE/
        MAX_BYTES, then `overrides`."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name, kind in (("attempts", int), ("backoff", float), ("max_backoff", float),
                           ("connect_timeout", float), ("stall_timeout", float), ("deadline", float),
                           ("max_bytes", int)):
            raw = env.get(ENV_PREFIX + name.upper())
            if raw is None or raw == "":
                continue
            try:
                value = kind(raw)
            except ValueError:
                raise InputError(f"{ENV_PREFIX}{name.upper()}: {raw!r} is not a number") from None
            if value <= 0 or (name == "attempts" and value > 100):
                raise InputError(f"{ENV_PREFIX}{name.upper()}: {raw!r} is out of range")
            values[name] = value
        return replace(cls(**values), **overrides)

    def wait(self, failures: int, retry_after: float | None = None) -> float:
        """Seconds to wait before the next attempt after `failures` failed attempts in a row."""
        base: float = min(self.max_backoff, self.backoff * 2 ** max(0, failures - 1))  # int ** int: Any
        base *= 1 - self.jitter * self.rand()
        if retry_after is not None:
            base = max(base, min(retry_after, self.max_backoff))
        return base

    def byte_cap(self, size: int | None) -> int:
        if self.max_bytes is not None:
            return self.max_bytes
        return 2 * size + CHUNK if size is not None else 16 << 30


class NotFoundError(InputError):
    """The server answered 404 for what was asked."""


class _Retry(Exception):
    """One attempt failed in a way worth another try."""

    def __init__(self, reason: str, *, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


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


@contextlib.contextmanager
def _plain_opener(url: str, verify: bool | str, extra: Mapping[str, str] | None,
                  insecure_http: bool) -> Iterator[Opener]:
    """A GET of `url` (checked here, before any connection) that follows redirects by the rules of
    nodeprep/stores/redirects.py, each hop checked before it is connected to; `extra` headers
    (an http store's credentials) go only to the origin of `url`. One session for all attempts."""
    check_transport(url, insecure_http=insecure_http, what="URL")
    what = redact_url(url)
    with session() as session_:

        def open_(headers: dict[str, str], timeout: tuple[float, float]) -> Any:
            target = url
            for _ in range(redirects.MAX_REDIRECTS + 1):
                hop = redirects.hop_headers({**(extra or {}), **headers}, url, target)
                resp = session_.get(target, headers=hop, stream=True, timeout=timeout, verify=verify,
                                    allow_redirects=False)
                if resp.status_code not in redirects.STATUSES:
                    return resp
                location = resp.headers.get("Location")
                resp.close()
                target = redirects.next_hop(what, target, location, insecure_http=insecure_http,
                                            server="store")
            raise InputError(f"{what}: more than {redirects.MAX_REDIRECTS} redirects for "
                             f"{redirects.shown(target)}; refused")

        yield open_


def fetch_bytes(url: str, *, policy: Policy | None = None, limit: int = 64 << 20,
                verify: bool | str = True, headers: Mapping[str, str] | None = None,
                insecure_http: bool = False) -> bytes:
    """Small documents (store index), at most `limit` bytes, within `policy` (default: the
    NODEPREP_FETCH_* variables). file:// and plain paths are read directly."""
    path = local_path(url)
    if path is not None:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise InputError(f"{path}: not found") from None
    with _plain_opener(url, verify, headers, insecure_http) as open_:
        return fetch_bytes_with(open_, redact_url(url), policy=policy or Policy.from_env(), limit=limit)


def fetch_bytes_with(open_: Opener, what: str, *, policy: Policy, limit: int = 64 << 20) -> bytes:
    """A whole small body through `open_`, with the retries and bounds of `policy` (no resume)."""
    out = bytearray()  # the chunks are copied out of the reader's reused buffer

    def attempt(timeout: tuple[float, float], deadline_at: float) -> None:
        out.clear()
        with _deadline_guard(policy, deadline_at, what) as watched, open_({}, timeout) as resp:
            watched.append(_socket(resp))
            _check_status(resp, what, resuming=False)
            for chunk in _iter_body(resp, what):
                out.extend(chunk)
                if len(out) > limit:
                    raise NetworkError(f"{what}: the response is larger than {limit} bytes; refused")
                _check_deadline(policy, deadline_at, what)
            _check_length(resp, len(out), 0)

    _run(attempt, what, policy, lambda: 0)
    return bytes(out)


def download(
    url: str,
    dest: Path,
    *,
    sha256: str,
    progress: Progress | None = None,
    policy: Policy | None = None,
    size: int | None = None,
    verify: bool | str = True,
    headers: Mapping[str, str] | None = None,
    insecure_http: bool = False,
) -> Path:
    """Download `url` to `dest`, resuming a previous `.part`, and verify `sha256` before the
    final rename. An existing `dest` with the right checksum is reused without a request.
    `policy` defaults to the NODEPREP_FETCH_* variables; `insecure_http` allows plain http off
    loopback (the URL and every redirect hop)."""
    src = local_path(url)
    if src is not None:
        sha256 = _check_hex(sha256)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if _have(dest, sha256):
            return dest
        if not src.is_file():
            raise InputError(f"{src}: not found")
        part = dest.with_name(dest.name + ".part")
        part.unlink(missing_ok=True)  # a fresh file, never written through a link left there
        shutil.copyfile(src, part)
        return _finish(part, dest, sha256, redact_url(url))
    with _plain_opener(url, verify, headers, insecure_http) as open_:
        return download_with(open_, redact_url(url), dest, sha256=sha256, size=size,
                             policy=policy or Policy.from_env(), progress=progress)


def download_with(open_: Opener, what: str, dest: Path, *, sha256: str, policy: Policy,
                  size: int | None = None, progress: Progress | None = None) -> Path:
    """Download through `open_` (a streaming GET that takes extra headers, e.g. Range) to `dest`;
    resumes `<dest>.part`; verifies `sha256` (and `size` when known) before the rename."""
    sha256 = _check_hex(sha256)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if _have(dest, sha256):
        return dest
    part = dest.with_name(dest.name + ".part")
    if part.is_symlink():  # never nodeprep's: a .part is a plain file it writes
        part.unlink()
    cap = policy.byte_cap(size)
    received = [0]
    # the furthest the kept bytes have reached: an attempt made progress only when it went past it
    # (a server that ignores Range and cuts at the same place makes none, however much it sends)
    furthest = [0]
    # sha256 of the first `hashed[0]` bytes of `part`, kept up to date while writing, so the file
    # is not read a second time to verify it (a resumed .part is hashed once, up to where it ends)
    digest = [hashlib.sha256()]
    hashed = [0]

    def rehash(upto: int) -> None:
        if hashed[0] == upto:
            return
        digest[0], hashed[0] = hashlib.sha256(), 0
        if upto:
            with open(part, "rb") as f:
                for block in iter(lambda: f.read(min(CHUNK, upto - hashed[0])), b""):
                    digest[0].update(block)
                    hashed[0] += len(block)
                    if hashed[0] >= upto:
                        break

    def attempt(timeout: tuple[float, float], deadline_at: float) -> None:
        have = part.stat().st_size if part.exists() else 0
        if size is not None and have > size:
            part.unlink()
            have = 0
        if size is not None and have == size:
            return
        # identity: a Range counts the bytes as stored (artifacts are compressed already)
        headers = {"Accept-Encoding": "identity", **({"Range": f"bytes={have}-"} if have else {})}
        with _deadline_guard(policy, deadline_at, what) as watched, open_(headers, timeout) as resp:
            watched.append(_socket(resp))
            if resp.status_code == 416 and have:
                if size is None:
                    return  # the server says there is nothing after what we have
                part.unlink()  # ours is not a prefix of theirs: start over
                raise _Retry("HTTP 416 for a resume; starting over")
            _check_status(resp, what, resuming=bool(have))
            if have and not _resumes_at(resp, have):
                have = 0  # the server ignored Range (or answered another one): start over
            total = _total(resp, have, size)
            done = have
            rehash(have)
            # "wb" truncates a .part being started over; no explicit truncate(): on ext4 a truncate to
            # size 0 makes close() start writing the file back at once (auto_da_alloc), which cost
            # nodes a third of their throughput (docs/fleet.md)
            with open(part, "ab" if have else "wb", opener=_no_follow) as f:
                for chunk in _iter_body(resp, what):
                    digest[0].update(chunk)
                    hashed[0] += len(chunk)
                    received[0] += len(chunk)
                    if received[0] > cap:
                        raise NetworkError(f"{what}: received more than {cap} bytes in all; gave up "
                                           f"(the store keeps sending)")
                    f.write(chunk)
                    done += len(chunk)
                    furthest[0] = max(furthest[0], done)
                    if size is not None and done > size:
                        part.unlink(missing_ok=True)
                        raise ChecksumError(f"{what}: the store sent more than the {size} bytes listed")
                    if progress and (done // CHUNK != (done - len(chunk)) // CHUNK or done == total):
                        progress(done, total)  # one report per MiB and at the end
                    _check_deadline(policy, deadline_at, what)
            _check_length(resp, done, have)
            if size is not None and done < size:
                raise _Retry(f"connection closed at byte {done} of {size}")

    _run(attempt, what, policy, lambda: furthest[0])
    length = part.stat().st_size if part.exists() else 0
    rehash(length)
    return _finish(part, dest, sha256, what, actual=digest[0].hexdigest())


def _run(attempt: Callable[[tuple[float, float], float], None], what: str, policy: Policy,
         kept: Callable[[], int]) -> None:
    """Call `attempt` until it returns, retrying _Retry and transport errors within `policy`.
    `kept()` is how far the kept bytes have reached: an attempt that raised it made progress."""
    # lazy: Ansible nodeprep_build, Ansible nodeprep_driver, Ansible nodeprep_join and 3 more starts
    import requests
    import urllib3.exceptions

    start = policy.clock()
    deadline_at = start + policy.deadline
    failures = 0
    tries = 0
    while True:
        tries += 1
        remaining = deadline_at - policy.clock()
        read_timeout = max(0.001, min(policy.stall_timeout, remaining))
        timeout = (min(policy.connect_timeout, read_timeout), read_timeout)
        retry_after: float | None = None
        before = kept()
        try:
            attempt(timeout, deadline_at)
            return
        except _Retry as e:
            reason, retry_after = str(e), e.retry_after
        except requests.exceptions.SSLError as e:
            raise NetworkError(f"{what}: TLS failed ({tls_reason(e)}); check --ca-file") from None
        except (requests.RequestException, urllib3.exceptions.HTTPError) as e:
            reason = _transport_reason(e, policy)
        progressed = kept() > before
        failures = 1 if progressed else failures + 1
        if failures >= policy.attempts:
            raise NetworkError(f"{what}: gave up after {tries} tries (last: {reason})")
        pause = policy.wait(failures, retry_after)
        if policy.clock() + pause >= deadline_at:
            raise NetworkError(f"{what}: gave up after {policy.deadline:g} s and {tries} tries "
                               f"(last: {reason})")
        log.info("%s: %s; try %d in %.1f s", what, reason, tries + 1, pause)
        policy.sleep(pause)


def _transport_reason(e: Exception, policy: Policy) -> str:
    text = str(e)
    low = text.lower()
    for needle, reason in (("timed out", f"stalled: no data for {policy.stall_timeout:g} s"),
                           ("incompleteread", "connection closed mid-body"),
                           ("connection broken", "connection closed mid-body"),
                           ("remotedisconnected", "connection closed by the server"),
                           ("connection reset", "connection reset by the server"),
                           ("connection refused", "connection refused"),
                           ("name or service not known", "host name not found"),
                           ("no route to host", "no route to host")):
        if needle in low:
            return reason
    if "timeout" in type(e).__name__.lower():
        return f"stalled: no data for {policy.stall_timeout:g} s"
    return _short(e)


def tls_reason(e: Exception) -> str:
    """The useful part of a TLS error ("certificate verify failed: self-signed certificate")."""
    m = re.search(r"(certificate verify failed[^(\])'\"]*)", str(e))
    return m.group(1).strip() if m else _short(e)


def _short(e: Exception) -> str:
    text = redact_url(str(e).splitlines()[0]) if str(e) else type(e).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def _check_status(resp: Any, what: str, *, resuming: bool) -> None:
    code = resp.status_code
    if code in (200, 206) or (code == 416 and resuming):
        return
    if code == 404:
        raise NotFoundError(f"{what}: not found (HTTP 404)")
    if code in (401, 403):
        raise InputError(f"{what}: access denied (HTTP {code}); check the credentials")
    if code in RETRY_STATUS:
        raise _Retry(f"HTTP {code}", retry_after=_retry_after(resp))
    raise InputError(f"{what}: HTTP {code}")


def _retry_after(resp: Any) -> float | None:
    raw = resp.headers.get("Retry-After", "")
    return float(raw) if raw.isdigit() else None


def _resumes_at(resp: Any, have: int) -> bool:
    if resp.status_code != 206:
        return False
    rng: str = resp.headers.get("Content-Range", "")
    return rng.startswith(f"bytes {have}-")


def _total(resp: Any, have: int, size: int | None) -> int | None:
    if size is not None:
        return size
    length = _content_length(resp)
    return length + have if length is not None else None


def _iter_body(resp: Any, what: str) -> Iterator[memoryview | bytes]:
    """The body of `resp`, in chunks valid until the next one is asked for (copy what is kept).

    A body without a content encoding (artifacts and blobs always) is read with the standard
    library's `http.client.HTTPResponse.readinto` under urllib3 (`resp.raw._fp`, present in urllib3
    1.26 and 2.x) into one reused buffer; anything else goes through requests' `iter_content`.
    A transport error mid-body is turned into urllib3's, which `_run` retries."""
    fp: Any = getattr(resp.raw, "_fp", None)  # urllib3's private http.client.HTTPResponse
    if _encoded(resp) or not callable(getattr(fp, "readinto", None)):
        yield from resp.iter_content(READ_CHUNK)
        return
    # lazy: Ansible nodeprep_build, Ansible nodeprep_driver, Ansible nodeprep_join and 3 more starts
    import http.client

    # lazy: Ansible nodeprep_build, Ansible nodeprep_driver, Ansible nodeprep_join and 3 more starts
    import urllib3.exceptions

    size = _content_length(resp) or READ_CHUNK
    buf = memoryview(bytearray(min(size, READ_CHUNK)))  # a manifest: its own size
    while True:
        try:
            n = fp.readinto(buf)
        except TimeoutError as e:  # socket.timeout: no byte within the read timeout
            # no pool at hand: urllib3 only shows and pickles it
            raise urllib3.exceptions.ReadTimeoutError(None, "", f"{what}: read timed out") from e  # type: ignore[arg-type]
        except (OSError, http.client.HTTPException) as e:  # reset, TLS record errors, IncompleteRead
            raise urllib3.exceptions.ProtocolError(f"Connection broken: {e!r}", e) from e
        if not n:
            # read to its end: the connection goes back to the pool (keep-alive), as after
            # iter_content, instead of being closed with the response
            if fp.isclosed() and callable(getattr(resp.raw, "release_conn", None)):
                resp.raw.release_conn()
            return
        yield buf[:n]


def _content_length(resp: Any) -> int | None:
    length = resp.headers.get("Content-Length", "")
    return int(length) if length.isdigit() else None


def _encoded(resp: Any) -> bool:
    return resp.headers.get("Content-Encoding", "").strip().lower() not in ("", "identity")


def _check_length(resp: Any, done: int, have: int) -> None:
    if _encoded(resp):
        return  # Content-Length counts the encoded bytes, `done` the decoded ones
    length = _content_length(resp)
    if length is not None and done - have < length:
        raise _Retry(f"connection closed at byte {done} (expected {length + have})")


def _check_deadline(policy: Policy, deadline_at: float, what: str) -> None:
    if policy.clock() > deadline_at:
        raise _deadline_error(policy, what)


def _deadline_error(policy: Policy, what: str) -> NetworkError:
    return NetworkError(f"{what}: gave up after {policy.deadline:g} s (the store is too slow)")


@contextlib.contextmanager
def _deadline_guard(policy: Policy, deadline_at: float, what: str) -> Iterator[list[Any]]:
    """One attempt against the deadline: shuts every socket the attempt uses (those a `session()`
    connects or reuses, and what the caller appends to the list yielded) when the time left runs
    out, and then fails with the deadline. A read fills the whole buffer before it returns (and a
    header line is read to its end), each receive with its own timeout, so a server that drips bytes
    within the stall timeout kept one read going past a deadline checked only between reads."""
    remaining = deadline_at - policy.clock()
    if remaining <= 0:
        raise _deadline_error(policy, what)
    watched: list[Any] = []
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        for sock in list(watched):
            if isinstance(sock, socket.socket):
                with contextlib.suppress(OSError):  # the base class's: an SSLSocket's own drops its state
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)

    timer = threading.Timer(remaining, expire)
    timer.daemon = True
    outer = getattr(_ATTEMPT, "sockets", None), getattr(_ATTEMPT, "time_left", None)
    _ATTEMPT.sockets, _ATTEMPT.time_left = watched, lambda: deadline_at - policy.clock()
    timer.start()
    try:
        yield watched
    except Exception:
        if expired.is_set():
            raise _deadline_error(policy, what) from None
        raise
    finally:
        _ATTEMPT.sockets, _ATTEMPT.time_left = outer
        timer.cancel()
    if expired.is_set():  # a body without a length ends quietly when its socket is shut
        raise _deadline_error(policy, what)


# The sockets of the attempt running in this thread (`_deadline_guard`), which a session() adds to
# as it connects or reuses them, and the seconds it has left (`time_left()`); None outside an attempt.
_ATTEMPT = threading.local()


def _bound_handshake(sock: Any) -> None:
    """Before a TLS handshake on the connected `sock`: its timeout cut to the attempt's time left
    (the ssl module bounds the whole handshake by it, however the server drips its records) and
    the socket known to the watchdog (which shuts it where the TLS layer keeps the socket itself)."""
    time_left = getattr(_ATTEMPT, "time_left", None)
    if time_left is None or not isinstance(sock, socket.socket):
        return
    timeout = sock.gettimeout()
    left = max(0.001, time_left())
    sock.settimeout(left if timeout is None else min(timeout, left))
    _watch(sock)


def _watch(sock: Any) -> None:
    watched = getattr(_ATTEMPT, "sockets", None)
    if watched is not None and sock is not None:
        watched.append(sock)


def session() -> Any:
    """A requests session for stores: no proxy variables or netrc credentials picked up behind our
    back, and every socket it connects (once connected, TLS included) or reuses known to the running
    attempt's deadline watchdog, so headers and body are under the deadline."""
    import requests  # imported on first network use: it costs ~50 ms, local stores never need it
    from requests.adapters import HTTPAdapter

    s = requests.Session()
    s.trust_env = False
    for adapter in s.adapters.values():
        assert isinstance(adapter, HTTPAdapter)  # what a new Session mounts (typed as BaseAdapter)
        adapter.poolmanager.pool_classes_by_scheme = _watched_pools()
    return s


@functools.cache
def _watched_pools() -> dict[str, type]:
    """urllib3's pool classes, with connections that report their socket to `_watch` on connect
    and on reuse (urllib3 1.26 and 2.x: `ConnectionCls`, `connect`, `_get_conn`)."""
    # lazy: Ansible nodeprep_build, Ansible nodeprep_driver, Ansible nodeprep_join and 3 more starts
    import urllib3
    from urllib3.connection import HTTPConnection, HTTPSConnection

    class Conn(HTTPConnection):
        def connect(self) -> None:
            super().connect()
            _watch(self.sock)

    class TLSConn(HTTPSConnection):
        def _new_conn(self) -> Any:  # the TCP connection, before the handshake (urllib3 1.26 and 2.x)
            sock = super()._new_conn()
            _bound_handshake(sock)
            return sock

        def connect(self) -> None:
            super().connect()
            _watch(self.sock)

    class Pool(urllib3.HTTPConnectionPool):
        ConnectionCls = Conn

        def _get_conn(self, timeout: float | None = None) -> Any:
            conn = super()._get_conn(timeout)
            _watch(getattr(conn, "sock", None))
            return conn

    class TLSPool(urllib3.HTTPSConnectionPool):
        ConnectionCls = TLSConn

        def _get_conn(self, timeout: float | None = None) -> Any:
            conn = super()._get_conn(timeout)
            _watch(getattr(conn, "sock", None))
            return conn

    return {"http": Pool, "https": TLSPool}


def _socket(resp: Any) -> socket.socket | None:
    """The socket under a streamed requests response (urllib3 1.26 and 2.x), or None."""
    raw = getattr(resp, "raw", None)
    sock = getattr(getattr(raw, "_connection", None), "sock", None)
    if sock is None:  # http.client's own reader: a buffered reader over a SocketIO
        sock = getattr(getattr(getattr(getattr(raw, "_fp", None), "fp", None), "raw", None), "_sock", None)
    return sock if isinstance(sock, socket.socket) else None


def _check_hex(sha256: str) -> str:
    sha256 = sha256.lower()
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise InputError(f"--sha256: {sha256!r} is not a sha256 hex digest (64 hex digits)")
    return sha256


def _have(dest: Path, sha256: str) -> bool:
    """`dest` is already there, a regular file (not a link) with this sha256."""
    return dest.is_file() and not dest.is_symlink() and sha256_file(dest) == sha256


def _no_follow(path: str, flags: int) -> int:
    """open()'s opener for a download's `.part`: never through a symbolic link left in its place."""
    return os.open(path, flags | os.O_NOFOLLOW, 0o644)


def _finish(part: Path, dest: Path, sha256: str, what: str, actual: str | None = None) -> Path:
    actual = actual or sha256_file(part)
    if actual != sha256:
        part.unlink(missing_ok=True)
        raise ChecksumError(f"{what}: sha256 {actual} does not match the expected {sha256}")
    publish_file(part, dest)
    return dest
