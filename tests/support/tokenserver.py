"""A bearer-token service on loopback for the test registry (distribution's `auth: token` mode).

The registry trusts `rootcertbundle` (a self-signed ES256 certificate made here); this server
answers `GET /token?service=...&scope=repository:NAME:ACTIONS` for one basic-auth user with a JWT
signed by that key (certificate in the `x5c` header), granting the requested actions. Wrong
credentials get 401, as does a POST (the refresh-token grant is not served). It counts the tokens
it issued and records every request it gets (`seen`: method, path with query, Authorization, body).
With `anonymous`, it grants tokens without credentials. With `redirect` = (status, base URL), it
answers every request (GET and POST) with that redirect to base URL + the request's path instead:
a realm that sends clients on to another origin (give the registry `registry_auth(realm=...)` of
that one and the bundle of the server that signs).
"""

from __future__ import annotations

import base64
import datetime
import json
import secrets
import ssl
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

ISSUER = "nodeprep-test-issuer"
SERVICE = "nodeprep-test-registry"


@dataclass(frozen=True)
class Seen:
    method: str
    path: str  # with the query
    authorization: str | None
    body: bytes


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenServer:
    def __init__(self, work: Path, *, user: str, password: str, tls_cert: Path, tls_key: Path,
                 anonymous: bool = False, redirect: tuple[int, str] | None = None) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self.user, self.password = user, password
        self.anonymous, self.redirect = anonymous, redirect
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nodeprep test token signer")])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(hours=1))
                     .not_valid_after(now + datetime.timedelta(days=2))
                     .sign(self.key, hashes.SHA256()))
        self.bundle = work / f"token-signer-{secrets.token_hex(4)}.pem"
        self.bundle.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        self.issued = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.tokens = self  # type: ignore[attr-defined]
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(tls_cert), str(tls_key))
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def realm(self) -> str:
        return f"https://127.0.0.1:{self.server.server_address[1]}/token"

    @property
    def base(self) -> str:
        return f"https://127.0.0.1:{self.server.server_address[1]}"

    def registry_auth(self, realm: str | None = None) -> dict[str, object]:
        """The registry's `auth` section: tokens signed here, the realm advertised `realm` (default
        this server's)."""
        return {"token": {"realm": realm or self.realm, "service": SERVICE, "issuer": ISSUER,
                          "rootcertbundle": str(self.bundle)}}

    def token(self, scope: str) -> str:
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

        access = []
        if scope:
            kind, name, actions = scope.split(":", 2)
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        der = self.cert.public_bytes(serialization.Encoding.DER)
        header = {"alg": "ES256", "typ": "JWT", "x5c": [base64.b64encode(der).decode()]}
        now = int(time.time())
        claims = {"iss": ISSUER, "sub": self.user, "aud": SERVICE, "exp": now + 300, "nbf": now - 10,
                  "iat": now, "jti": secrets.token_hex(8), "access": access}
        signing = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        r, s = decode_dss_signature(self.key.sign(signing.encode(), ec.ECDSA(hashes.SHA256())))
        with self.lock:
            self.issued += 1
        return f"{signing}.{_b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"

    def __enter__(self) -> TokenServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def _recorded(self) -> bool:
        """Records the request; answers it with the redirect when the server has one (True)."""
        tokens: TokenServer = self.server.tokens  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        with tokens.lock:
            tokens.seen.append(Seen(self.command, self.path, self.headers.get("Authorization"),
                                    self.rfile.read(length) if length else b""))
        if tokens.redirect is None:
            return False
        status, base = tokens.redirect
        self.send_response(status)
        self.send_header("Location", base + self.path)
        self.send_header("Content-Length", "0")
        self.end_headers()
        return True

    def do_POST(self) -> None:
        if not self._recorded():
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()

    def do_GET(self) -> None:
        if self._recorded():
            return
        tokens: TokenServer = self.server.tokens  # type: ignore[attr-defined]
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        expected = "Basic " + base64.b64encode(f"{tokens.user}:{tokens.password}".encode()).decode()
        authorized = tokens.anonymous or self.headers.get("Authorization") == expected
        if url.path != "/token" or not authorized:
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = json.dumps({"token": tokens.token(query.get("scope", [""])[0])}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
