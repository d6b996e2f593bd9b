"""The node's download path against a misbehaving store: a real loopback HTTP server
(tests/support/faultproxy.py) that cuts connections, stalls, answers 5xx in bursts, ignores Range or
sends too much. Assertions are on bytes served and outcomes; waits go to an injected sleep, so no
test waits for a backoff and none asserts on timing."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeprep import download
from nodeprep.errors import ChecksumError, InputError, NetworkError
from tests.support.faultproxy import FaultProxy, Faults

SIZE = 3 * (1 << 20) + 12345


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("served")
    (d / "blob.bin").write_bytes(os.urandom(SIZE))
    return d


@pytest.fixture
def proxy(served: Path) -> Iterator[FaultProxy]:
    with FaultProxy(directory=served) as p:
        yield p


def digest(served: Path) -> str:
    return hashlib.sha256((served / "blob.bin").read_bytes()).hexdigest()


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def policy(**kw: object) -> tuple[download.Policy, Sleeps]:
    sleeps = Sleeps()
    base = {"attempts": 3, "backoff": 0.5, "max_backoff": 4.0, "stall_timeout": 5.0}
    return download.Policy(sleep=sleeps, **{**base, **kw}), sleeps  # type: ignore[arg-type]


def fetch(proxy: FaultProxy, served: Path, dest: Path, pol: download.Policy, **kw: object) -> Path:
    return download.download(f"{proxy.url}/blob.bin", dest, sha256=digest(served), policy=pol,
                             **kw)  # type: ignore[arg-type]


def test_cut_connections_resume_and_fetch_each_byte_once(proxy: FaultProxy, served: Path,
                                                         tmp_path: Path) -> None:
    proxy.reset(Faults(cut_after=1 << 20))  # every response dies after 1 MiB
    pol, sleeps = policy()
    out = fetch(proxy, served, tmp_path / "blob", pol, size=SIZE)
    assert out.read_bytes() == (served / "blob.bin").read_bytes()
    assert proxy.served_for("blob.bin") == SIZE  # resumed: nothing fetched twice
    ranges = [s.range for s in proxy.seen]
    assert ranges == [None, "bytes=1048576-", "bytes=2097152-", "bytes=3145728-"]
    assert all(s <= 0.5 for s in sleeps)  # progress resets the backoff
    assert not (tmp_path / "blob.part").exists()


def test_partial_file_from_an_earlier_run_is_resumed(proxy: FaultProxy, served: Path, tmp_path: Path) -> None:
    proxy.reset()
    data = (served / "blob.bin").read_bytes()
    (tmp_path / "blob.part").write_bytes(data[:1000000])
    fetch(proxy, served, tmp_path / "blob", policy()[0], size=SIZE)
    assert proxy.served_for("blob.bin") == SIZE - 1000000


def test_5xx_burst_is_retried_with_growing_jittered_backoff(proxy: FaultProxy, served: Path,
                                                           tmp_path: Path) -> None:
    proxy.reset(Faults(fail_burst=3))
    pol, sleeps = policy(attempts=5)
    fetch(proxy, served, tmp_path / "blob", pol)
    assert [s.status for s in proxy.seen] == [503, 503, 503, 200]
    assert len(sleeps) == 3
    for i, s in enumerate(sleeps):  # backoff * 2^i, times (1 - jitter * U[0,1))
        assert 0.5 * 2**i * 0.5 <= s <= 0.5 * 2**i


def test_5xx_burst_longer_than_the_attempts_gives_up_with_one_line(proxy: FaultProxy, served: Path,
                                                                  tmp_path: Path) -> None:
    proxy.reset(Faults(fail_burst=10))
    with pytest.raises(NetworkError) as e:
        fetch(proxy, served, tmp_path / "blob", policy(attempts=3)[0])
    assert "gave up after 3 tries" in str(e.value) and "HTTP 503" in str(e.value)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "blob").exists()
    assert len(proxy.seen) == 3


def test_stalled_server_is_given_up_on_and_resumed(proxy: FaultProxy, served: Path, tmp_path: Path) -> None:
    proxy.reset(Faults(stall_after=2 * download.READ_CHUNK + 500000, stalls=1))  # two whole reads first
    fetch(proxy, served, tmp_path / "blob", policy(stall_timeout=0.3)[0], size=SIZE)
    # A read that times out drops what it had buffered: at most one read chunk is fetched twice.
    assert SIZE <= proxy.served_for("blob.bin") <= SIZE + download.READ_CHUNK
    assert proxy.seen[1].range is not None and proxy.seen[1].range != "bytes=0-"


def test_server_that_always_stalls_fails_in_bounded_tries(proxy: FaultProxy, served: Path,
                                                         tmp_path: Path) -> None:
    proxy.reset(Faults(stall_after=0))
    with pytest.raises(NetworkError) as e:
        fetch(proxy, served, tmp_path / "blob", policy(stall_timeout=0.2, attempts=2)[0], size=SIZE)
    assert "stalled" in str(e.value)
    assert len(proxy.seen) == 2


def test_deadline_bounds_the_whole_transfer(proxy: FaultProxy, served: Path, tmp_path: Path) -> None:
    proxy.reset(Faults(cut_after=1 << 20))
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0  # every look at the clock costs a second
        return now[0]

    pol, _ = policy(deadline=8.0, clock=clock)
    with pytest.raises(NetworkError) as e:
        fetch(proxy, served, tmp_path / "blob", pol, size=SIZE)
    assert "gave up after 8 s" in str(e.value)
    assert (tmp_path / "blob.part").exists() and not (tmp_path / "blob").exists()


def test_server_ignoring_range_restarts_and_byte_cap_stops_a_loop(proxy: FaultProxy, served: Path,
                                                                 tmp_path: Path) -> None:
    proxy.reset(Faults(cut_after=2 << 20, cuts=1, ignore_range=True))
    fetch(proxy, served, tmp_path / "blob", policy()[0], size=SIZE)  # restarts from 0: still right
    assert proxy.served_for("blob.bin") == SIZE + (2 << 20)
    proxy.reset(Faults(cut_after=2 << 20, ignore_range=True))
    with pytest.raises(NetworkError) as e:
        fetch(proxy, served, tmp_path / "other", policy(attempts=50, max_bytes=SIZE * 2)[0], size=SIZE)
    assert "received more than" in str(e.value)
    assert proxy.served_for("blob.bin") <= SIZE * 2 + (2 << 20)


def test_more_bytes_than_listed_is_refused(proxy: FaultProxy, served: Path, tmp_path: Path) -> None:
    proxy.reset(Faults(extra_bytes=4096))
    with pytest.raises(ChecksumError) as e:
        fetch(proxy, served, tmp_path / "blob", policy()[0], size=SIZE)
    assert "more than the" in str(e.value)
    assert not (tmp_path / "blob").exists() and not (tmp_path / "blob.part").exists()


def test_not_found_is_input_error_without_retries(proxy: FaultProxy, served: Path, tmp_path: Path) -> None:
    proxy.reset()
    with pytest.raises(InputError) as e:
        download.download(f"{proxy.url}/missing.bin", tmp_path / "m", sha256="0" * 64, policy=policy()[0])
    assert "HTTP 404" in str(e.value)
    assert len(proxy.seen) == 1


def test_policy_from_environment() -> None:
    pol = download.Policy.from_env({"NODEPREP_FETCH_ATTEMPTS": "2", "NODEPREP_FETCH_DEADLINE": "60",
                                    "NODEPREP_FETCH_MAX_BYTES": "1000"})
    assert (pol.attempts, pol.deadline, pol.max_bytes) == (2, 60.0, 1000)
    with pytest.raises(InputError, match="NODEPREP_FETCH_STALL_TIMEOUT"):
        download.Policy.from_env({"NODEPREP_FETCH_STALL_TIMEOUT": "soon"})
    capped = download.Policy(backoff=1, max_backoff=3, jitter=0, rand=lambda: 0.0)
    assert [capped.wait(n) for n in (1, 2, 3, 4)] == [1, 2, 3, 3]
    assert capped.wait(1, retry_after=100) == 3  # Retry-After honoured up to the cap


def test_http_store_sends_basic_credentials_from_the_credentials_file(proxy: FaultProxy, served: Path,
                                                                      tmp_path: Path) -> None:
    import base64
    import json

    from nodeprep.stores.oci import Options
    from nodeprep.stores.store import Store

    (served / "index.json").write_text('{"format": 1, "artifacts": []}\n')
    host = f"127.0.0.1:{proxy.port}"
    proxy.reset(Faults(authorization="Basic " + base64.b64encode(b"robot:pw").decode()))
    creds = tmp_path / "config.json"
    creds.write_text(json.dumps({"auths": {host: {"username": "robot", "password": "pw"}}}))
    creds.chmod(0o600)
    assert Store(proxy.url, Options(registry_auth=str(creds))).entries() == []
    with pytest.raises(InputError, match="HTTP 401"):
        Store(proxy.url).entries()
    with pytest.raises(InputError, match="credentials in the URL are refused") as e:
        Store(f"http://robot:pw@{host}")
    assert "pw" not in str(e.value)
