"""Transport trust for every store kind and every redirect hop (issue 25, items 3 and 5): plain http
only to loopback or with --insecure-http, decided before connecting; no credentials in a store URL
however written; the NODEPREP_FETCH_* bounds mean the same for http stores as for registries, and
the deadline is a wall-clock bound even against a server that drips its bytes.

Real loopback servers (tests/support/faultproxy.py and a dripping one here) and the real CLI. No
test sends a packet off loopback: tests/support/loopback.py records every connection and name lookup
and refuses off-loopback ones, so "refused before connecting" is "nothing recorded for the address"
and "the flag lifts the refusal" is "the attempt was made (and stopped by the guard)"."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeprep import download
from nodeprep.cli import main
from nodeprep.errors import InputError, NetworkError
from nodeprep.stores.oci import Options
from nodeprep.stores.store import Store
from nodeprep.urls import parse_store_location, plain_http_allowed, redact_url
from tests.support.clirunner import separate_stderr
from tests.support.faultproxy import FaultProxy, Faults
from tests.support.httpdir import serve

TEST_NET = "192.0.2.1"  # RFC 5737: never routed; the guard stops any attempt anyway
DRIVER, KERNEL = "535.309.01", "6.1.0-28-amd64"
INDEX = b'{"format": 1, "artifacts": []}\n'


def install(root: Path, store: str, *extra: str, env: dict[str, str] | None = None) -> tuple[int, str, float]:
    """`nodeprep install` against `store`: (exit code, stderr, seconds)."""
    root.mkdir(exist_ok=True)  # --root must exist
    start = time.monotonic()
    result = separate_stderr().invoke(main, ["install", "--store", store, "--driver", DRIVER, "--kernel",
                                             KERNEL, "--root", str(root), *extra], env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stderr, time.monotonic() - start


def error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    d = tmp_path / "served" / "s"
    d.mkdir(parents=True)
    (d / "index.json").write_bytes(INDEX)
    return d.parent


@pytest.fixture
def proxy(store_dir: Path) -> Iterator[FaultProxy]:
    with FaultProxy(directory=store_dir) as p:
        yield p


# --- item 3: plain http only on loopback or with the flag, for every store kind and hop ------------

@pytest.mark.parametrize("store", [f"http://{TEST_NET}/s", f"HTTP://{TEST_NET}:8080/s/", f"oci+http://{TEST_NET}/gpu/d"])
def test_plain_http_store_off_loopback_is_refused_before_connecting(tmp_path: Path, attempts: list[str],
                                                                    store: str) -> None:
    code, err, seconds = install(tmp_path / "root", store)
    assert code == 2
    line = error_line(err)
    assert line.startswith("error: --store: ") and "plain http" in line and "--insecure-http" in line
    assert attempts == [] and seconds < 5  # refused from the URL alone: no connection, no lookup
    assert list((tmp_path / "root").iterdir()) == []


def test_artifacts_list_applies_the_same_rule(attempts: list[str]) -> None:
    result = separate_stderr().invoke(main, ["artifacts", "list", f"http://{TEST_NET}/s"])
    assert result.exit_code == 2 and "plain http to a store off loopback" in error_line(result.stderr)
    assert attempts == []


def test_insecure_http_lifts_the_refusal_for_an_http_store(attempts: list[str]) -> None:
    with pytest.raises(InputError, match="plain http"):
        Store(f"http://{TEST_NET}/s")
    assert attempts == []
    with pytest.raises(AssertionError, match="non-loopback"):  # the guard stops the attempt
        Store(f"http://{TEST_NET}/s", Options(insecure_http=True)).entries()
    assert attempts == [TEST_NET]


@pytest.mark.parametrize(("host", "insecure", "allowed"), [
    ("127.0.0.1", False, True), ("127.3.4.5", False, True), ("::1", False, True),
    ("localhost", False, True), ("LOCALHOST", False, True),
    (TEST_NET, False, False), ("localhost.example", False, False), ("127.0.0.1.example", False, False),
    ("127.1", False, False), ("0x7f.0.0.1", False, False), ("::ffff:127.0.0.1", False, False),
    (TEST_NET, True, True), ("files.example", True, True),
])
def test_the_rule(host: str, insecure: bool, allowed: bool) -> None:
    assert plain_http_allowed(host, insecure_http=insecure) is allowed
    url = f"http://[{host}]/s" if ":" in host else f"http://{host}/s"
    if allowed:
        assert parse_store_location(url, insecure_http=insecure) == url
    else:
        with pytest.raises(InputError, match="plain http to a store off loopback"):
            parse_store_location(url, insecure_http=insecure)
    assert parse_store_location(url.replace("http", "https", 1), insecure_http=False)  # https: any host


@pytest.mark.parametrize("url", [
    f"http://{TEST_NET}\\@127.0.0.1/s",  # urlsplit: host 127.0.0.1; urllib3: host 192.0.2.1
    f"http://127.0.0.1\\.{TEST_NET}/s",
    "http://127.0.0.1/s\tx", "http://127.0.0.1:99999/s", "http:///s",
])
def test_urls_parsers_read_differently_are_refused(url: str, attempts: list[str]) -> None:
    with pytest.raises(InputError):
        parse_store_location(url, insecure_http=False)
    with pytest.raises(InputError):
        download.fetch_bytes(url + "/index.json")
    assert attempts == []


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_redirect_of_a_loopback_store_to_plain_http_off_loopback_is_refused_at_the_hop(
        proxy: FaultProxy, tmp_path: Path, attempts: list[str], status: int) -> None:
    proxy.reset(Faults(redirect=f"http://{TEST_NET}", redirect_status=status))
    code, err, _ = install(tmp_path / "root", f"{proxy.url}/s")
    assert code == 2
    assert (f"the store redirected to plain http (http://{TEST_NET}/s/index.json), off loopback; refused "
            f"(--insecure-http allows it)") in error_line(err)
    assert TEST_NET not in attempts and [s.status for s in proxy.seen] == [status]
    with pytest.raises(AssertionError, match="non-loopback"):  # the flag lifts it: the hop is tried
        Store(f"{proxy.url}/s", Options(insecure_http=True)).entries()
    assert attempts[-1] == TEST_NET


def test_redirects_within_loopback_are_followed_bounded_and_keep_credentials_home(
        proxy: FaultProxy, store_dir: Path, tmp_path: Path) -> None:
    with FaultProxy(directory=store_dir) as target:
        proxy.reset(Faults(redirect=target.url, redirect_status=302))
        assert Store(f"{proxy.url}/s").entries() == []
        assert [s.path for s in target.seen] == ["/s/index.json"]
        # the store's credentials go to the store, not to where it redirects (another port)
        secret = "Basic " + base64.b64encode(b"robot:pw").decode()
        target.reset(Faults(authorization=secret))
        creds = tmp_path / "config.json"
        creds.write_text(json.dumps({"auths": {f"127.0.0.1:{proxy.port}": {"username": "robot",
                                                                         "password": "pw"}}}))
        creds.chmod(0o600)
        with pytest.raises(InputError, match="HTTP 401"):
            Store(f"{proxy.url}/s", Options(registry_auth=str(creds))).entries()
    proxy.reset(Faults(redirect=proxy.url))  # to itself, again and again
    with pytest.raises(InputError, match="more than 5 redirects"):
        Store(f"{proxy.url}/s").entries()
    assert len(proxy.seen) == 6


# --- item 5: credentials in a store URL, however written -------------------------------------------

def test_credentials_behind_a_leading_space_are_refused_before_any_request(proxy: FaultProxy,
                                                                           tmp_path: Path) -> None:
    root = tmp_path / "root"
    code, err, _ = install(root, f" http://user:pass@127.0.0.1:{proxy.port}/s")
    assert code == 2
    line = error_line(err)
    assert "credentials in the URL are refused" in line and "pass" not in err
    assert proxy.seen == []  # the server received nothing, so no Basic header either
    assert not (root / "var" / "lib" / "nodeprep" / "state.json").exists()


@pytest.mark.parametrize("store", [
    "https://user:Passw0rd@store.example/s", " http://user:Passw0rd@127.0.0.1:1/s", "\thttps://u:Passw0rd@h/s\n",
    "HTTPS://user:Passw0rd@store.example/s", "https://user:P@ss@Passw0rd@store.example/s",
    "https://user%3APassw0rd@store.example/s", "https://Passw0rd@store.example/s",
    "oci://user:Passw0rd@registry.example/gpu/d", "file://user:Passw0rd@host/srv/s",
])
def test_credentials_in_any_url_are_refused_and_redacted_whole(store: str, tmp_path: Path,
                                                              attempts: list[str]) -> None:
    with pytest.raises(InputError, match="credentials in the URL are refused") as e:
        parse_store_location(store, insecure_http=False)
    assert "Passw0rd" not in str(e.value) and "P@ss" not in str(e.value)
    code, err, _ = install(tmp_path / "root", store)
    assert code == 2 and "credentials in the URL are refused" in error_line(err)
    assert "Passw0rd" not in err and attempts == []


def test_redaction_uses_the_userinfo_as_parsed() -> None:
    assert redact_url("https://user:P@ss@Passw0rd@store.example/s") == "https://<redacted>@store.example/s"
    assert redact_url("a http://u:p@h/x, b oci://h/r@sha256:ab") == "a http://<redacted>@h/x, b oci://h/r@sha256:ab"


def test_the_recorded_store_is_the_normalised_one(proxy: FaultProxy) -> None:
    assert Store(f"  {proxy.url}/s\n").location == f"{proxy.url}/s"


# --- item 5: the NODEPREP_FETCH_* bounds for http stores, wall-clock deadline ------------------------

PEERS: list[int] = []  # the client port of each request _Drip answered


class _Drip(http.server.BaseHTTPRequestHandler):
    """Announces 100000 bytes and sends one every 50 ms (for at most 6 s, then hangs up); for a path
    with "headers" in it, drips a header line instead."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def do_GET(self) -> None:  # noqa: N802
        PEERS.append(self.client_address[1])
        if self.path == "/ok":
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
            return
        self.send_response(200)
        self.send_header("Content-Length", "100000")
        if "headers" not in self.path:
            self.end_headers()
        else:
            self.flush_headers()
            self.wfile.write(b"X-Slow: ")
        end = time.monotonic() + 6
        try:
            while time.monotonic() < end:
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.05)
        except OSError:
            pass
        self.close_connection = True


@pytest.fixture
def drip() -> Iterator[str]:
    with serve(_Drip, daemon_threads=True) as url:
        yield url


def test_deadline_is_wall_clock_against_a_dripping_store(drip: str, tmp_path: Path) -> None:
    env = {"NODEPREP_FETCH_DEADLINE": "0.5", "NODEPREP_FETCH_STALL_TIMEOUT": "1"}
    code, err, seconds = install(tmp_path / "root", f"{drip}/s", env=env)
    assert code == 1
    assert error_line(err) == f"error: {drip}/s/index.json: gave up after 0.5 s (the store is too slow)"
    assert seconds < 3  # each byte came within the stall timeout: only the deadline ends it


@pytest.mark.parametrize("path", ["a.tar.zst", "headers/a.tar.zst"], ids=["body", "headers"])
def test_the_deadline_also_bounds_an_artifact_download(drip: str, tmp_path: Path, path: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A dripping body, or dripping response headers ("headers" in the path)."""
    monkeypatch.setenv("NODEPREP_FETCH_DEADLINE", "0.5")
    start = time.monotonic()
    with pytest.raises(NetworkError, match=r"gave up after 0\.5 s"):
        download.download(f"{drip}/{path}", tmp_path / "a", sha256="0" * 64, size=100000)
    assert time.monotonic() - start < 3
    if path == "a.tar.zst":
        assert (tmp_path / "a.part").stat().st_size > 0  # kept for the next run to resume


def test_the_deadline_bounds_a_kept_alive_connection_too(drip: str, tmp_path: Path) -> None:
    """The registry's case: one session, its connection reused for the next request, whose headers
    then drip."""
    session = download.session()
    PEERS.clear()

    def opener(path: str) -> download.Opener:
        return lambda headers, timeout: session.get(f"{drip}{path}", headers=headers, stream=True,
                                                    timeout=timeout)

    policy = download.Policy(deadline=0.5)
    assert download.fetch_bytes_with(opener("/ok"), "ok", policy=policy) == b"ok"
    start = time.monotonic()
    with pytest.raises(NetworkError, match=r"gave up after 0\.5 s"):
        download.fetch_bytes_with(opener("/headers"), "slow", policy=policy)
    assert time.monotonic() - start < 3
    assert len(PEERS) == 2 and PEERS[0] == PEERS[1]  # the same connection



@pytest.fixture
def tls_drip() -> Iterator[str]:
    """A loopback TCP server that takes the ClientHello and answers with the header of a 16 KiB TLS
    handshake record, then drips its body one byte every 50 ms (for at most 6 s): every receive
    gets a byte well within any timeout, so only a bound on the whole handshake ends it."""
    srv = socket.create_server(("127.0.0.1", 0))
    conns: list[socket.socket] = []

    def one(conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            conn.recv(65536)
            conn.sendall(b"\x16\x03\x03\x40\x00")
            end = time.monotonic() + 6
            while time.monotonic() < end:
                conn.sendall(b"\x02")
                time.sleep(0.05)

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = srv.accept()
                conns.append(conn)
                threading.Thread(target=one, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        srv.close()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        thread.join(5)


def test_the_deadline_bounds_a_dripping_tls_handshake(tls_drip: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The handshake is part of the transfer: its socket's timeout is the attempt's time left when
    the handshake starts, and the watchdog knows the socket from then on."""
    monkeypatch.setenv("NODEPREP_FETCH_DEADLINE", "1")
    monkeypatch.setenv("NODEPREP_FETCH_CONNECT_TIMEOUT", "30")
    monkeypatch.setenv("NODEPREP_FETCH_STALL_TIMEOUT", "30")
    start = time.monotonic()
    with pytest.raises(NetworkError, match=r"gave up after 1 s"):
        download.download(f"{tls_drip}/a.tar.zst", tmp_path / "a", sha256="0" * 64, size=100000)
    assert time.monotonic() - start < 3  # the server drips for 6 s


class _Answer(http.server.BaseHTTPRequestHandler):
    """Answers every GET, after `delay` seconds, with `status`, the headers `answer` and no body."""

    delay = 0.0
    status = 200
    answer: dict[str, str] = {}

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def do_GET(self) -> None:  # noqa: N802
        time.sleep(self.delay)
        self.send_response(self.status)
        for k, v in {**self.answer, "Content-Length": "0"}.items():
            self.send_header(k, v)
        self.end_headers()


def test_a_handshake_late_in_the_attempt_gets_only_the_time_left(tls_drip: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A redirect hop's handshake starts 2.5 s into a 3 s attempt: it gets the 0.5 s left, not the
    attempt's whole timeout again (it ran to 5.5 s: the watchdog did not know the socket yet and the
    handshake's timeout was taken at the start of the attempt)."""
    monkeypatch.setenv("NODEPREP_FETCH_DEADLINE", "3")
    monkeypatch.setenv("NODEPREP_FETCH_STALL_TIMEOUT", "30")
    # answers after 2.5 s (within every per-receive timeout) with a redirect to the dripping TLS store
    handler = type("Redirect", (_Answer,), {"delay": 2.5, "status": 302,
                                            "answer": {"Location": f"{tls_drip}/a.tar.zst"}})
    with serve(handler, daemon_threads=True) as url:
        start = time.monotonic()
        with pytest.raises(NetworkError, match=r"gave up after 3 s"):
            download.download(f"{url}/a.tar.zst", tmp_path / "a", sha256="0" * 64, size=100000)
        assert time.monotonic() - start < 4.5

def test_stall_timeout_and_attempts_from_the_environment_hold_for_http_stores(proxy: FaultProxy,
                                                                              tmp_path: Path) -> None:
    proxy.reset(Faults(match="index.json", stall_after=0))
    unstall = threading.Timer(6, proxy.release.set)  # a 30 s stall timeout would hold the test longer
    unstall.daemon = True
    unstall.start()
    env = {"NODEPREP_FETCH_ATTEMPTS": "1", "NODEPREP_FETCH_STALL_TIMEOUT": "0.3"}
    code, err, seconds = install(tmp_path / "root", f"{proxy.url}/s", env=env)
    unstall.cancel()
    assert code == 1
    assert error_line(err).endswith("index.json: gave up after 1 tries (last: stalled: no data for 0.3 s)")
    assert len(proxy.seen) == 1 and seconds < 4


def test_attempts_from_the_environment_hold_for_an_http_index(proxy: FaultProxy,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    proxy.reset(Faults(fail_burst=10))
    monkeypatch.setenv("NODEPREP_FETCH_ATTEMPTS", "1")
    with pytest.raises(NetworkError, match=r"gave up after 1 tries \(last: HTTP 503\)"):
        Store(f"{proxy.url}/s").entries()
    assert len(proxy.seen) == 1


def test_a_body_cut_short_each_time_with_range_ignored_is_not_progress(
        proxy: FaultProxy, store_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each try gets the same first bytes again (Range ignored) and then the connection closes: the
    kept bytes never pass where they were, so the tries are counted and end."""
    data = os.urandom(64 << 10)
    (store_dir / "a.bin").write_bytes(data)
    proxy.reset(Faults(match="a.bin", cut_after=len(data) - 1000, ignore_range=True))
    monkeypatch.setenv("NODEPREP_FETCH_ATTEMPTS", "3")
    monkeypatch.setenv("NODEPREP_FETCH_BACKOFF", "0.01")
    with pytest.raises(NetworkError, match=r"gave up after 3 tries"):
        download.download(f"{proxy.url}/a.bin", tmp_path / "a", sha256=hashlib.sha256(data).hexdigest(),
                          size=len(data))
    assert len(proxy.seen) == 3
    assert [s.range for s in proxy.seen] == [None, f"bytes={len(data) - 1000}-", f"bytes={len(data) - 1000}-"]


class _Challenger(_Answer):
    """A plain-http registry on loopback whose bearer challenge names a token realm off loopback."""

    protocol_version = "HTTP/1.1"
    status = 401
    answer = {"WWW-Authenticate": f'Bearer realm="http://{TEST_NET}/token",service="reg"'}


def test_a_plain_http_token_realm_off_loopback_gets_no_credentials(tmp_path: Path,
                                                                   attempts: list[str]) -> None:
    with serve(_Challenger) as url:
        host = url.removeprefix("http://")
        creds = _auth_file(tmp_path, host, {"username": "robot", "password": "pw"})
        with pytest.raises(InputError, match="token realm 'http://192.0.2.1/token' is not https"):
            Store(f"oci+http://{host}/gpu/d", Options(registry_auth=creds)).entries()
    assert TEST_NET not in attempts


# --- issue 35, finding 5: the token realm follows the store's redirect rules ----------------------

REFRESH = "refresh-Passw0rd-token"


@contextlib.contextmanager
def _recording(answer: Any) -> Iterator[tuple[str, list[tuple[str, str, str | None, bytes]]]]:
    """A loopback HTTP server that records (method, path, Authorization, body) of every request and
    answers it with `answer(port) -> (status, headers, body)`; yields (base URL, records)."""
    seen: list[tuple[str, str, str | None, bytes]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            seen.append((self.command, self.path, self.headers.get("Authorization"),
                         self.rfile.read(length) if length else b""))
            status, headers, body = answer()
            self.send_response(status)
            for k, v in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_HEAD = _any  # noqa: N815

    with serve(Handler, daemon_threads=True) as url:
        yield url, seen


@contextlib.contextmanager
def _realm_redirecting(status: int, location: str) -> Iterator[tuple[str, list[Any]]]:
    """A plain-http registry on loopback whose bearer realm (another loopback port) answers every
    request with `status` to `location`; yields (the registry's host:port, the realm's records)."""
    with _recording(lambda: (status, {"Location": location}, b"")) as (realm, realm_seen):
        challenge = {"WWW-Authenticate": f'Bearer realm="{realm}/token",service="reg"'}
        with _recording(lambda: (401, challenge, b"")) as (registry, _):
            yield registry.removeprefix("http://"), realm_seen


def _auth_file(tmp_path: Path, host: str, entry: dict[str, str]) -> str:
    creds = tmp_path / "config.json"
    creds.write_text(json.dumps({"auths": {host: entry}}))
    creds.chmod(0o600)
    return str(creds)


@pytest.mark.parametrize("status", [302, 307, 308])
def test_a_token_realm_redirect_never_carries_the_refresh_token_to_another_origin(
        tmp_path: Path, status: int) -> None:
    """A refresh-token POST answered with a redirect to another loopback origin (a different port) is
    not sent on (requests re-POSTed the form, token included, on a 307/308): refused with one line,
    and the other server receives nothing."""
    token = json.dumps({"token": "t"}).encode()
    with _recording(lambda: (200, {"Content-Type": "application/json"}, token)) as (other, other_seen), \
            _realm_redirecting(status, f"{other}/token") as (host, realm_seen):
        creds = _auth_file(tmp_path, host, {"identitytoken": REFRESH})
        with pytest.raises(InputError) as e:
            Store(f"oci+http://{host}/gpu/d", Options(registry_auth=creds)).entries()
    assert [(m, p) for m, p, _, body in other_seen if REFRESH.encode() in body or REFRESH in p] == []
    assert other_seen == []
    assert [(m, REFRESH.encode() in body) for m, _, _, body in realm_seen] == [("POST", True)]
    assert (f"the token service answered the refresh-token POST with a redirect (HTTP {status})"
            in str(e.value))
    assert REFRESH not in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("status", [302, 307])
def test_a_token_realm_redirect_sends_basic_credentials_only_to_the_realm(tmp_path: Path,
                                                                          status: int) -> None:
    """A basic-authenticated token GET is redirected to another loopback origin: followed (the store's
    rule), without the Authorization header."""
    token = json.dumps({"token": "t"}).encode()
    with _recording(lambda: (200, {"Content-Type": "application/json"}, token)) as (other, other_seen), \
            _realm_redirecting(status, f"{other}/token") as (host, realm_seen):
        creds = _auth_file(tmp_path, host, {"username": "robot", "password": "Passw0rd"})
        with pytest.raises(InputError, match="the registry refused the credentials"):
            Store(f"oci+http://{host}/gpu/d", Options(registry_auth=creds)).entries()
    secret = "Basic " + base64.b64encode(b"robot:Passw0rd").decode()
    assert [(m, a) for m, _, a, _ in realm_seen] == [("GET", secret)]
    assert [(m, a) for m, _, a, _ in other_seen] == [("GET", None)]


def test_a_token_realm_redirect_to_plain_http_off_loopback_is_refused_before_connecting(
        tmp_path: Path, attempts: list[str]) -> None:
    """The realm's hop is checked like a store's: plain http off loopback is refused from the URL,
    exit 2, one line; --insecure-http lets it be tried (and the guard stops it)."""
    with _realm_redirecting(302, f"http://{TEST_NET}/token?secret=x") as (host, realm_seen):
        creds = _auth_file(tmp_path, host, {"username": "robot", "password": "Passw0rd"})
        code, err, _ = install(tmp_path / "root", f"oci+http://{host}/gpu/d", "--registry-auth", creds)
        assert code == 2
        assert error_line(err) == (f"error: oci+http://{host}/gpu/d: the token service redirected to plain "
                                   f"http (http://{TEST_NET}/token), off loopback; refused (--insecure-http "
                                   f"allows it)")
        assert TEST_NET not in attempts and len(realm_seen) == 1
        assert "Passw0rd" not in err and "secret" not in err
        with pytest.raises(NetworkError, match="token service"):
            Store(f"oci+http://{host}/gpu/d", Options(registry_auth=creds, insecure_http=True)).entries()
    assert attempts[-1] == TEST_NET
