"""The download path's body reader against the framings a store may use: Content-Length (read into
one reused buffer), chunked transfer encoding, a chunked body cut mid-chunk, and a gzip content
encoding (decoded by requests). A real loopback HTTP/1.1 server; assertions on the bytes written."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeprep import download
from nodeprep.errors import NetworkError
from tests.support.httpdir import serve

BODY = os.urandom(3 * download.READ_CHUNK + 4321)
SHA = hashlib.sha256(BODY).hexdigest()
ENCODINGS: list[str] = []
PEERS: set[int] = set()  # the client ports requests came from: one per connection


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    served: list[str]
    encodings: list[str]
    cut_first: list[bool]

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def do_GET(self) -> None:  # noqa: N802
        self.served.append(self.path)
        PEERS.add(self.client_address[1])
        self.encodings.append(self.headers.get("Accept-Encoding", ""))
        if self.path == "/gzip":
            data = gzip.compress(BODY)
            self.send_response(200)
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        step = 200_000
        for i in range(0, len(BODY), step):
            piece = BODY[i:i + step]
            if self.path == "/chunked-cut" and self.cut_first[0] and i >= 2 * step:
                self.cut_first[0] = False
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece[:1000])
                self.close_connection = True
                return
            self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        self.wfile.write(b"0\r\n\r\n")


@pytest.fixture
def server() -> Iterator[tuple[str, list[str]]]:
    """(base URL, paths served); the Accept-Encoding headers received are in `ENCODINGS`."""
    served: list[str] = []
    ENCODINGS.clear()
    PEERS.clear()
    handler = type("H", (_Handler,), {"served": served, "cut_first": [True], "encodings": ENCODINGS})
    with serve(handler) as url:
        yield url, served


def policy(**kw: object) -> download.Policy:
    return download.Policy(sleep=lambda s: None, **{"attempts": 3, "stall_timeout": 5.0, **kw})  # type: ignore[arg-type]


def test_chunked_body_lands_whole(server: tuple[str, list[str]], tmp_path: Path) -> None:
    url, served = server
    out = download.download(f"{url}/chunked", tmp_path / "blob", sha256=SHA, policy=policy())
    assert out.read_bytes() == BODY
    assert served == ["/chunked"]


def test_chunked_body_cut_mid_chunk_is_fetched_again(server: tuple[str, list[str]], tmp_path: Path) -> None:
    url, served = server
    out = download.download(f"{url}/chunked-cut", tmp_path / "blob", sha256=SHA, policy=policy(),
                            size=len(BODY))
    assert out.read_bytes() == BODY
    assert served == ["/chunked-cut", "/chunked-cut"]


def test_chunked_body_cut_every_time_gives_up_with_one_line(server: tuple[str, list[str]],
                                                            tmp_path: Path) -> None:
    url, _ = server
    with pytest.raises(NetworkError, match=r"gave up after 1 tries \(last: connection closed mid-body\)"):
        download.download(f"{url}/chunked-cut", tmp_path / "blob", sha256=SHA, policy=policy(attempts=1),
                          size=len(BODY))
    assert not (tmp_path / "blob").exists()


def test_downloads_ask_for_the_bytes_as_stored(server: tuple[str, list[str]], tmp_path: Path) -> None:
    url, _ = server
    download.download(f"{url}/chunked", tmp_path / "blob", sha256=SHA, policy=policy())
    assert ENCODINGS == ["identity"]


def test_gzip_encoded_body_is_decoded_once(server: tuple[str, list[str]], tmp_path: Path) -> None:
    """A server that encodes anyway (this one ignores Accept-Encoding: identity): the decoded
    bytes land, fetched once (Content-Length counts the encoded bytes and is not held against the
    decoded ones)."""
    url, served = server
    out = download.download(f"{url}/gzip", tmp_path / "blob", sha256=SHA, policy=policy())
    assert out.read_bytes() == BODY
    assert served == ["/gzip"]
    assert download.fetch_bytes(f"{url}/gzip", policy=policy()) == BODY
    assert served == ["/gzip", "/gzip"]


def test_small_documents_are_copied_out_of_the_reused_buffer(server: tuple[str, list[str]]) -> None:
    url, _ = server
    assert download.fetch_bytes(f"{url}/chunked", policy=policy()) == BODY


@pytest.mark.parametrize("make", ["requests", "download"])
def test_a_session_keeps_its_connection_across_downloads(server: tuple[str, list[str]],
                                                         tmp_path: Path, make: str) -> None:
    """The registry client's case: one session for manifests and blobs (download.session(), whose
    sockets the deadline watchdog knows, or a plain requests.Session). A body read to its end hands
    the connection back for the next request (keep-alive), chunked or not."""
    import requests

    url, served = server
    session = download.session() if make == "download" else requests.Session()

    def opener(path: str) -> download.Opener:
        return lambda headers, timeout: session.get(f"{url}{path}", headers=headers, stream=True,
                                                    timeout=timeout)

    for i, path in enumerate(("/chunked", "/chunked", "/gzip")):
        out = download.download_with(opener(path), path, tmp_path / f"blob{i}", sha256=SHA, policy=policy())
        assert out.read_bytes() == BODY
    assert download.fetch_bytes_with(opener("/chunked"), "small", policy=policy()) == BODY
    assert served == ["/chunked", "/chunked", "/gzip", "/chunked"]
    assert len(PEERS) == 1
