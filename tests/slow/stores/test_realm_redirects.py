"""A real registry's token realm that redirects (issue 35, finding 5), end to end: Debian's
docker-registry (tests/support/registry.py) in token mode advertises as its realm a loopback
server of the test that answers every request with a redirect to a second loopback origin (another
port), which records every request it gets (both are tests/support/tokenserver.py's TokenServer,
the first with `redirect`). The realm's rules are the store's (`Registry._follow`): a refresh-token
POST answered with a redirect is refused and never sent on; a basic-authenticated GET is followed
without its Authorization; a hop to plain http off loopback is refused before connecting unless
--insecure-http. The unit tests with a stand-in registry: tests/unit/stores/test_transport.py
(`test_a_token_realm_redirect_*`).

The CLI runs in-process under tests/support/loopback.py's guard, so no test sends a packet off
loopback and "refused before connecting" is "no attempt recorded for the address". Nothing is
published for the refusals: the realm is asked at the first authenticated request (the `index`
manifest), before any blob; the one success pushes an empty directory store.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from nodeprep.cli import main
from tests.support.clirunner import separate_stderr
from tests.support.faultproxy import FaultProxy
from tests.support.loopback import guard
from tests.support.registry import PASSWORD, USER, Registry, make_ca, start_registry, write_auth_file
from tests.support.tokenserver import SERVICE, Seen, TokenServer

pytestmark = pytest.mark.slow

REPO = "gpu/realm-redirects"
REFRESH = "refresh-s3cret-identity-token"  # an identitytoken as docker login writes for token registries
TEST_NET = "192.0.2.1"  # RFC 5737: never routed; the guard stops any attempt anyway
BASIC = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


@dataclass
class Realms:
    registry: Registry
    realm: TokenServer  # the realm the registry advertises: answers with its `redirect`
    other: TokenServer  # the second origin: signs the tokens the registry trusts, records requests
    tls: tuple[Path, Path, Path]
    work: Path

    @property
    def location(self) -> str:
        return self.registry.url(REPO)

    def redirect(self, status: int, base: str) -> None:
        """From now on the realm answers `status` to `base` + the request's path; both forget
        what they saw."""
        self.realm.redirect = (status, base)
        self.realm.seen.clear()
        self.other.seen.clear()
        self.other.issued = 0


@pytest.fixture(scope="module")
def realms(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Realms]:
    work = tmp_path_factory.mktemp("realm-redirects")
    tls = make_ca(work / "tls")
    with TokenServer(work, user=USER, password=PASSWORD, tls_cert=tls[1], tls_key=tls[2]) as other, \
            TokenServer(work, user=USER, password=PASSWORD, tls_cert=tls[1], tls_key=tls[2],
                        redirect=(307, "")) as realm, \
            start_registry(work / "registry", auth=other.registry_auth(realm=realm.realm), tls=tls) as reg:
        yield Realms(reg, realm, other, tls, work)


@pytest.fixture
def attempts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The hosts the test tried to reach (tests/support/loopback.py); off-loopback ones refused."""
    return guard(monkeypatch)


def auth_file(path: Path, host: str, entry: dict[str, str]) -> Path:
    path.write_text(json.dumps({"auths": {host: entry}}))
    path.chmod(0o600)
    return path


def nodeprep(*args: str) -> tuple[int, str, str]:
    """The real CLI in-process (under the test's loopback guard): (exit code, stdout, stderr)."""
    result = separate_stderr().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


def listing(r: Realms, auth: Path, *extra: str) -> tuple[int, str, str]:
    return nodeprep("artifacts", "list", r.location, "--registry-auth", str(auth), "--ca-file",
                    str(r.registry.ca), "--json", *extra)


def error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def token_query(seen: Seen) -> dict[str, list[str]]:
    url = urlsplit(seen.path)
    assert url.path == "/token", seen
    return parse_qs(url.query)


PULL = {"scope": [f"repository:{REPO}:pull"], "service": [SERVICE]}


@pytest.mark.parametrize("status", [302, 307, 308])
def test_a_real_registry_realm_redirect_never_carries_the_refresh_token(
        realms: Realms, attempts: list[str], tmp_path: Path, status: int) -> None:
    """An identitytoken in the auth file: the refresh-token POST to the realm the real registry
    advertises is answered with a redirect to the second origin; refused with one line, exit 2, the
    second origin receives nothing (before the fix: 307/308 re-POSTed the token there, 302 sent a
    GET), and the token is in no output."""
    r = realms
    r.redirect(status, r.other.base)
    auth = auth_file(tmp_path / "config.json", r.registry.host, {"identitytoken": REFRESH})
    code, out, err = listing(r, auth)
    assert [(s.method, s.path) for s in r.other.seen if REFRESH.encode() in s.body] == []  # no leak
    assert r.other.seen == [] and r.other.issued == 0  # not even a GET
    assert code == 2, err
    assert error_line(err) == (
        f"error: {r.location}: the token service answered the refresh-token POST with a redirect "
        f"(HTTP {status}); nodeprep sends the token only to the realm {r.realm.realm}; refused")
    assert [(s.method, urlsplit(s.path).path, s.authorization) for s in r.realm.seen] == \
        [("POST", "/token", None)]
    form = parse_qs(r.realm.seen[0].body.decode())
    assert form["refresh_token"] == [REFRESH] and form["grant_type"] == ["refresh_token"]
    assert REFRESH not in out + err
    assert set(attempts) == {"127.0.0.1"}


@pytest.mark.parametrize("status", [302, 307])
def test_a_real_registry_realm_redirect_sends_basic_credentials_only_to_the_realm(
        realms: Realms, attempts: list[str], tmp_path: Path, status: int) -> None:
    """Basic credentials: the token GET is followed to the second origin (the store's rule for a
    GET) without the Authorization header. The second origin is a token service that wants those
    credentials, so it answers 401: one line, exit 2, no token issued, nothing else asked, the
    password in no output."""
    r = realms
    r.redirect(status, r.other.base)
    auth = write_auth_file(tmp_path / "config.json", r.registry.host)
    code, out, err = listing(r, auth)
    assert code == 2, err
    assert error_line(err) == (f"error: {r.location}: the token service refused the credentials for "
                               f"{r.registry.host} (HTTP 401)")
    assert [(s.method, s.authorization) for s in r.realm.seen] == [("GET", BASIC)]
    assert [(s.method, s.authorization, s.body) for s in r.other.seen] == [("GET", None, b"")]
    assert token_query(r.realm.seen[0]) == token_query(r.other.seen[0]) == PULL
    assert r.other.issued == 0
    assert PASSWORD not in out + err and BASIC.split()[1] not in out + err
    assert set(attempts) == {"127.0.0.1"}


def test_a_real_registry_accepts_the_token_of_the_redirect_target(
        realms: Realms, attempts: list[str], tmp_path: Path) -> None:
    """The same redirect (307) to a second origin that grants tokens without credentials: the
    redirect is followed and its token is what the real registry accepts: an (empty) store is
    pushed and listed back, exit 0; the second origin never sees the Authorization header, the
    realm sees it on every token request."""
    r = realms
    r.redirect(307, r.other.base)
    r.other.anonymous = True
    try:
        store = tmp_path / "store"
        store.mkdir()
        (store / "index.json").write_text('{"format": 1, "artifacts": []}\n')
        auth = write_auth_file(tmp_path / "config.json", r.registry.host)
        code, out, err = nodeprep("artifacts", "push", str(store), r.location, "--registry-auth", str(auth),
                                  "--ca-file", str(r.registry.ca), "--json")
        assert code == 0, err
        pushed = r.other.issued
        code, out, err = listing(r, auth)
        assert code == 0, err
        assert json.loads(out) == []
    finally:
        r.other.anonymous = False
    assert pushed >= 1 and r.other.issued > pushed
    assert {s.authorization for s in r.realm.seen} == {BASIC}
    assert len(r.other.seen) == len(r.realm.seen) == r.other.issued
    assert {s.authorization for s in r.other.seen} == {None}
    assert token_query(r.other.seen[-1]) == PULL
    assert "pull,push" in token_query(r.other.seen[0])["scope"][0]
    assert set(attempts) == {"127.0.0.1"}


def test_a_real_registry_realm_redirect_to_plain_http_off_loopback_is_refused_before_connecting(
        realms: Realms, attempts: list[str], tmp_path: Path) -> None:
    """The realm redirects (302) to plain http on a TEST-NET address: refused from the URL before
    any connection or lookup, one line, exit 2, the credentials in no output; --insecure-http lets
    the hop be tried (the guard stops it: a transport failure, exit 1)."""
    r = realms
    r.redirect(302, f"http://{TEST_NET}")
    auth = write_auth_file(tmp_path / "config.json", r.registry.host)
    code, out, err = listing(r, auth)
    assert TEST_NET not in attempts and set(attempts) == {"127.0.0.1"}
    assert code == 2, err
    assert error_line(err) == (f"error: {r.location}: the token service redirected to plain http "
                               f"(http://{TEST_NET}/token), off loopback; refused (--insecure-http "
                               f"allows it)")
    assert [(s.method, s.authorization) for s in r.realm.seen] == [("GET", BASIC)]
    assert r.other.seen == []
    assert PASSWORD not in out + err and "scope" not in err

    # --insecure-http is plain http to the store too: the registry through a plain-http loopback
    # proxy (tests/support/faultproxy.py), the realm and its redirect as before
    with FaultProxy(upstream=f"https://{r.registry.host}", cafile=r.registry.ca) as proxy:
        host = f"127.0.0.1:{proxy.port}"
        auth = write_auth_file(tmp_path / "proxy.json", host)
        code, _, err = nodeprep("artifacts", "list", f"oci://{host}/{REPO}", "--registry-auth", str(auth),
                                "--ca-file", str(r.registry.ca), "--insecure-http")
    assert code == 1, err
    assert error_line(err) == (f"error: oci+http://{host}/{REPO}: token service {r.realm.realm} "
                               f"unreachable (AssertionError)")
    assert attempts[-1] == TEST_NET and PASSWORD not in err
