"""A small client for the few calls of the OCI distribution API nodeprep needs.

Pull: GET a manifest (by tag or digest), GET a blob (with Range, through nodeprep/download.py's
resumable, bounded transfer). Push: HEAD/POST/PUT a blob (monolithic upload), PUT a manifest.
Authentication: basic, and the bearer-token flow (`WWW-Authenticate: Bearer realm=...`,
credentials from a docker-style config file, nodeprep/stores/auth.py). Redirects (a blob served
by object storage or a file server) are followed by the rules of nodeprep/stores/redirects.py.
Everything fetched is checked against its digest before it is returned. Why not the `oras` library:
docs/build.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urljoin, urlsplit

from .. import download
from ..errors import ChecksumError, InputError, NetworkError
from ..urls import check_http_url, plain_http_allowed
from . import redirects
from .auth import Challenge, Credentials, basic_header, parse_challenge
from .ref import OciRef

log = logging.getLogger(__name__)

MT_OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MANIFEST_LIMIT = 4 << 20


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Registry:
    """One repository of one registry, with a requests session and cached authorization."""

    def __init__(self, ref: OciRef, *, credentials: Credentials | None = None,
                 ca_file: str | None = None, policy: download.Policy | None = None,
                 push: bool = False, insecure_http: bool = False) -> None:
        self.ref = ref
        self.insecure_http = insecure_http  # plain-http redirect targets off loopback (redirects.py)
        self.credentials = credentials
        self.verify: bool | str = ca_file or True
        self.policy = policy or download.Policy.from_env()
        self.scope = f"repository:{ref.repository}:" + ("pull,push" if push else "pull")
        self.session = download.session()  # no proxies or netrc; its sockets under the deadline
        self._authorization: str | None = None

    # -- transport ---------------------------------------------------------------------------

    @property
    def timeout(self) -> tuple[float, float]:
        return (self.policy.connect_timeout, self.policy.stall_timeout)

    def request(self, method: str, url: str, *, headers: dict[str, str] | None = None,
                data: Any = None, stream: bool = False,
                timeout: tuple[float, float] | None = None) -> Any:
        """One request, answering a 401 challenge once (basic or bearer) and retrying it; a
        GET follows redirects by the rules of nodeprep/stores/redirects.py."""
        headers = dict(headers or {})
        for round_ in range(2):
            if self._authorization:
                headers["Authorization"] = self._authorization
            resp, elsewhere = self._follow(method, url, headers, data=data, stream=stream,
                                           timeout=timeout or self.timeout)
            if elsewhere:
                return resp  # a redirect target's answer: its status is judged by the caller
            if resp.status_code != 401:
                if resp.status_code == 403:
                    resp.close()
                    raise InputError(f"{self.ref}: access denied (HTTP 403) for {self.scope}; check the "
                                     f"credentials' permissions")
                return resp
            challenge = parse_challenge(resp.headers.get("WWW-Authenticate", ""))
            resp.close()
            if round_ == 1 or challenge is None:
                break
            self._authorization = self._authorize(challenge)
            if hasattr(data, "seek"):
                data.seek(0)
        if self.credentials is None:
            raise InputError(f"{self.ref}: the registry requires authentication; give a credentials "
                             f"file with --registry-auth (or NODEPREP_REGISTRY_AUTH)")
        raise InputError(f"{self.ref}: the registry refused the credentials for {self.ref.host} "
                         f"(HTTP 401)")

    def _follow(self, method: str, url: str, headers: dict[str, str], *, data: Any, stream: bool,
                timeout: tuple[float, float], home: str | None = None,
                server: str = "registry") -> tuple[Any, bool]:
        """The response to `method url`, through at most MAX_REDIRECTS redirects (GET only; another
        method's redirect is returned unfollowed), and whether it came from another origin than
        `home`'s (default: the registry's), the one origin the Authorization header goes to. Every
        hop is checked by redirects.next_hop before it is connected to."""
        home = home or self.ref.base_url
        for _ in range(redirects.MAX_REDIRECTS + 1):
            elsewhere = redirects.origin(url) != redirects.origin(home)
            hop = redirects.hop_headers(headers, home, url)
            resp = self.session.request(method, url, headers=hop, data=data, stream=stream,
                                        timeout=timeout, verify=self.verify, allow_redirects=False)
            if resp.status_code not in redirects.STATUSES or method not in redirects.FOLLOWED_METHODS:
                return resp, elsewhere
            location = resp.headers.get("Location")
            resp.close()
            url = redirects.next_hop(str(self.ref), url, location, insecure_http=self.insecure_http,
                                     server=server)
        raise InputError(f"{self.ref}: more than {redirects.MAX_REDIRECTS} redirects for "
                         f"{redirects.shown(url)}; refused")

    def _authorize(self, challenge: Challenge) -> str | None:
        creds = self.credentials
        if challenge.scheme == "basic":
            if creds is None or creds.username is None or creds.password is None:
                return None
            return basic_header(creds)
        if challenge.scheme != "bearer" or "realm" not in challenge.params:
            raise InputError(f"{self.ref}: unsupported authentication scheme {challenge.scheme!r}")
        return "Bearer " + self._token(challenge.params)

    def _token(self, params: dict[str, str]) -> str:
        """The bearer-token flow: ask the realm for a token for our scope."""
        realm = params["realm"]
        parts = check_http_url(realm, what=f"{self.ref}: token realm")
        plain_ok = self.ref.plain_http and plain_http_allowed(parts.hostname or "",
                                                              insecure_http=self.insecure_http)
        if parts.scheme != "https" and not plain_ok:  # the transport rule (urls.py), as for a hop
            raise InputError(f"{self.ref}: token realm {redirects.shown(realm)!r} is not https (plain http "
                             f"only to loopback or with --insecure-http); refusing to send credentials there")
        query = {"scope": self.scope}
        if "service" in params:
            query["service"] = params["service"]
        creds = self.credentials
        try:  # redirects by the store's rules (stores/redirects.py), the realm's origin as home
            if creds is not None and creds.identity_token:
                form = {**query, "grant_type": "refresh_token", "refresh_token": creds.identity_token,
                        "client_id": "nodeprep"}
                resp, _ = self._follow("POST", realm, {}, data=form, stream=False, timeout=self.timeout,
                                       home=realm, server="token service")
            else:
                headers = {"Authorization": basic_header(creds)} if creds and creds.username else {}
                url = realm + ("&" if urlsplit(realm).query else "?") + urlencode(query)
                resp, _ = self._follow("GET", url, headers, data=None, stream=False, timeout=self.timeout,
                                       home=realm, server="token service")
        except InputError:
            raise
        except Exception as e:  # transport errors: one line, no credentials in it
            raise NetworkError(f"{self.ref}: token service {redirects.shown(realm)} unreachable "
                               f"({type(e).__name__})") from None
        if resp.status_code in redirects.STATUSES:  # a POST's redirect: the refresh token stays home
            resp.close()
            raise InputError(f"{self.ref}: the token service answered the refresh-token POST with a "
                             f"redirect (HTTP {resp.status_code}); nodeprep sends the token only to "
                             f"the realm {redirects.shown(realm)}; refused")
        with resp:
            if resp.status_code in (401, 403):
                raise InputError(f"{self.ref}: the token service refused the credentials for "
                                 f"{self.ref.host} (HTTP {resp.status_code})")
            if resp.status_code != 200:
                raise NetworkError(f"{self.ref}: token service answered HTTP {resp.status_code}")
            try:
                body = resp.json()
            except ValueError:
                raise NetworkError(f"{self.ref}: token service sent no JSON") from None
        token = body.get("token") or body.get("access_token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token:
            raise NetworkError(f"{self.ref}: token service sent no token")
        return token

    def _opener(self, url: str, extra: dict[str, str] | None = None) -> download.Opener:
        def open_(headers: dict[str, str], timeout: tuple[float, float]) -> Any:
            return self.request("GET", url, headers={**(extra or {}), **headers}, stream=True,
                                timeout=timeout)

        return open_

    # -- pull --------------------------------------------------------------------------------

    def manifest(self, reference: str, *, accept: str = MT_OCI_MANIFEST) -> tuple[bytes, str]:
        """The manifest `reference` (a tag or a digest) and its digest, verified: against the
        digest asked for, or the registry's Docker-Content-Digest when asked by tag."""
        url = f"{self.ref.repo_url}manifests/{reference}"
        what = self.ref.name_of(reference)
        header: list[str] = []

        def open_(headers: dict[str, str], timeout: tuple[float, float]) -> Any:
            resp = self.request("GET", url, headers={"Accept": accept, **headers}, stream=True,
                                timeout=timeout)
            header[:] = [resp.headers.get("Docker-Content-Digest", "")]
            return resp

        raw = download.fetch_bytes_with(open_, what, policy=self.policy, limit=MANIFEST_LIMIT)
        digest = sha256_digest(raw)
        expected = reference if reference.startswith("sha256:") else (header[0] if header else "")
        if expected and expected != digest:
            raise ChecksumError(f"{what}: manifest digest {digest} does not match {expected}")
        return raw, digest

    def blob_bytes(self, digest: str, size: int, *, limit: int = 64 << 20) -> bytes:
        """A small blob, verified against `digest` and `size`."""
        if size > limit:
            raise InputError(f"{self.ref.name_of(digest)}: blob of {size} bytes is larger than {limit}")
        what = self.ref.name_of(digest)
        raw = download.fetch_bytes_with(self._opener(f"{self.ref.repo_url}blobs/{digest}"), what,
                                        policy=self.policy, limit=limit)
        if len(raw) != size or sha256_digest(raw) != digest:
            raise ChecksumError(f"{what}: blob content ({len(raw)} bytes, {sha256_digest(raw)}) does not "
                                f"match its descriptor ({size} bytes)")
        return raw

    def download_blob(self, digest: str, dest: Path, *, size: int,
                      progress: download.Progress | None = None) -> Path:
        """Blob `digest` into `dest`: resumable (Range), bounded, verified before it appears."""
        if not digest.startswith("sha256:"):
            raise InputError(f"{self.ref}: unsupported digest algorithm in {digest!r}")
        return download.download_with(self._opener(f"{self.ref.repo_url}blobs/{digest}"),
                                      self.ref.name_of(digest), dest, sha256=digest[len("sha256:"):],
                                      size=size, policy=self.policy, progress=progress)

    # -- push --------------------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        # lazy: Ansible nodeprep_driver
        import requests

        try:
            return fn()
        except requests.exceptions.SSLError as e:
            raise NetworkError(f"{what}: TLS failed ({download.tls_reason(e)}); check --ca-file") from None
        except requests.RequestException as e:
            raise NetworkError(f"{what}: {download._short(e)}") from None

    def has_blob(self, digest: str) -> bool:
        url = f"{self.ref.repo_url}blobs/{digest}"
        resp = self._call(str(self.ref), lambda: self.request("HEAD", url))
        with resp:  # a redirect (to where the registry keeps the bytes) says it has the blob too
            return bool(resp.status_code == 200 or resp.status_code in redirects.STATUSES)

    def push_blob(self, digest: str, size: int, *, path: Path | None = None,
                  data: bytes | None = None) -> None:
        """Upload a blob (one POST + one monolithic PUT) unless the repository has it."""
        if self.has_blob(digest):
            return
        what = f"{self.ref}: upload of {digest}"
        resp = self._call(what, lambda: self.request("POST", f"{self.ref.repo_url}blobs/uploads/",
                                                     headers={"Content-Length": "0"}))
        with resp:
            if resp.status_code != 202 or "Location" not in resp.headers:
                raise NetworkError(f"{what}: starting the upload answered HTTP {resp.status_code}")
            location = urljoin(self.ref.base_url, resp.headers["Location"])
        sep = "&" if "?" in location else "?"
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}

        def put() -> Any:
            if path is not None:
                with open(path, "rb") as f:
                    return self.request("PUT", f"{location}{sep}digest={digest}", headers=headers, data=f,
                                        timeout=(self.policy.connect_timeout, max(self.policy.stall_timeout,
                                                                                  120.0)))
            return self.request("PUT", f"{location}{sep}digest={digest}", headers=headers, data=data)

        resp = self._call(what, put)
        with resp:
            if resp.status_code != 201:
                raise NetworkError(f"{what}: HTTP {resp.status_code} {_errors(resp)}")

    def push_manifest(self, reference: str, body: bytes, media_type: str = MT_OCI_MANIFEST) -> str:
        """PUT a manifest under a tag (or its digest); returns its digest."""
        digest = sha256_digest(body)
        what = f"{self.ref}:{reference}"
        resp = self._call(what, lambda: self.request(
            "PUT", f"{self.ref.repo_url}manifests/{reference}", headers={"Content-Type": media_type},
            data=body))
        with resp:
            if resp.status_code != 201:
                raise NetworkError(f"{what}: pushing the manifest answered HTTP {resp.status_code} "
                                   f"{_errors(resp)}")
            echoed = resp.headers.get("Docker-Content-Digest")
        if echoed and echoed != digest:
            raise ChecksumError(f"{what}: the registry stored digest {echoed}, expected {digest}")
        return digest

    def has_manifest(self, reference: str) -> bool:
        url = f"{self.ref.repo_url}manifests/{reference}"
        resp = self._call(str(self.ref),
                          lambda: self.request("HEAD", url, headers={"Accept": MT_OCI_MANIFEST}))
        with resp:
            if resp.status_code in (200, 404):
                return bool(resp.status_code == 200)
            raise NetworkError(f"{self.ref}:{reference}: HTTP {resp.status_code}")


def _errors(resp: Any) -> str:
    """The registry's error codes (distribution spec error body), without details."""
    try:
        body = json.loads(resp.content[:65536])
        codes = [e.get("code", "?") for e in body.get("errors", []) if isinstance(e, dict)]
        return "(" + ", ".join(codes) + ")" if codes else ""
    except (ValueError, AttributeError):
        return ""
