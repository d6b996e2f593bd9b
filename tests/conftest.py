"""Shared test configuration.

Tiers: fast tests run everywhere; `@pytest.mark.slow` tests do real work (driver compile, qemu boot,
SSH test hosts) and run in CI too. The slow tier shares one real driver build per run (see
tests/support/realbuild.py) and caches downloads under NODEPREP_TEST_CACHE.
"""

from __future__ import annotations

import getpass
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from nodeprep.builder.buildroot import mounts_under
from tests.support import boundary
from tests.support.fixtures import NVIDIA_SMI, REPO

# Every path a test opens, lists or runs beside the repository is recorded (tests/support/boundary.py);
# the test during which it happened fails, so a lone clone passes the same tests as this checkout.
BOUNDARY = boundary.install(REPO)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Fails the test whose body read, listed or ran a path beside the repository."""
    result = yield
    hits = BOUNDARY.take()
    if hits:
        pytest.fail(f"the test touched paths outside the repository {REPO}:\n{_listed(hits)}", pytrace=False)
    return result


@pytest.fixture(autouse=True)
def repository_boundary() -> Iterator[boundary.Guard]:
    """The guard; fails the test whose fixtures (set up or torn down) touched a path beside the
    repository (the test body is checked by pytest_runtest_call)."""
    yield BOUNDARY
    hits = BOUNDARY.take()
    if hits:
        pytest.fail(f"the test touched paths outside the repository {REPO}:\n{_listed(hits)}", pytrace=False)


def _listed(hits: list[tuple[str, str]]) -> str:
    return "\n".join(f"  {event} {path}" for event, path in dict.fromkeys(hits))


_COLLECTION_HITS: list[tuple[str, str]] = []


def pytest_collection_finish(session: pytest.Session) -> None:
    _COLLECTION_HITS.extend(BOUNDARY.take())  # module-level reads while importing test files


PYTEST_TEMP = Path(tempfile.gettempdir()) / f"pytest-of-{getpass.getuser()}"


def _run_alive(run: Path) -> bool:
    """Whether the pytest process that made the numbered directory `run` still runs (pytest writes
    its PID into `run/.lock` and removes the file when it exits)."""
    try:
        pid = int((run / ".lock").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return True


def _detach_leaked_mounts(runs: list[Path], when: str) -> None:
    """Lazily unmount whatever is still mounted under these runs' temporary directories (a test that
    leaked a mount, or a run that was killed), so that pytest's removal of old runs' directories
    never descends into a bind mount of the host's /dev or /proc."""
    points = [point for run in runs for point in mounts_under(run)]
    for point in points:
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)
    if points:
        print(f"\nwarning: {len(points)} mount(s) left {when}, detached: "
              f"{', '.join(points[:5])}{' ...' if len(points) > 5 else ''}")


def pytest_configure(config: pytest.Config) -> None:
    """Before pytest removes old runs' directories: detach the mounts of runs that have ended (a
    run still going, e.g. a second session beside this one, keeps its mounts)."""
    if PYTEST_TEMP.is_dir():
        ended = [run for run in PYTEST_TEMP.glob("pytest-*")
                 if not run.is_symlink() and run.is_dir() and not _run_alive(run)]
        _detach_leaked_mounts(ended, f"under {PYTEST_TEMP} by an earlier run")


@pytest.fixture(scope="session", autouse=True)
def no_mounts_left(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Set up first, torn down last: after every other fixture has torn down, nothing may stay
    mounted under this run's temporary directory; what did is detached and named."""
    base = tmp_path_factory.getbasetemp()
    yield
    _detach_leaked_mounts([base], f"under {base} by this run")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Collection-time and session-teardown reads beside the repository fail the run too."""
    hits = _COLLECTION_HITS + BOUNDARY.take()
    if hits:
        print(f"\nerror: paths outside the repository {REPO} were touched outside any test:\n{_listed(hits)}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

# Hypothesis profiles (property tests, e.g. tests/unit/test_extraction_property.py). `ci` (default):
# bounded so each property test stays well under 30 s; `long`: a local soak. No example database
# is written into the checkout; a failure prints its `@reproduce_failure` blob instead.
settings.register_profile("ci", max_examples=200, deadline=None, database=None, print_blob=True)
settings.register_profile("long", max_examples=5000, deadline=None, database=None, print_blob=True)
settings.load_profile(os.environ.get("NODEPREP_HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def test_cache() -> Path:
    """Persistent download/build cache for the slow tier (survives between runs)."""
    path = Path(os.environ.get("NODEPREP_TEST_CACHE", Path.home() / ".cache" / "nodeprep-tests"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def nvidia_smi_fixtures() -> Path:
    """The recorded `nvidia-smi -q -x` captures kept in the repository (tests/fixtures/nvidia-smi)."""
    return NVIDIA_SMI


@pytest.fixture(scope="session")
def real_build(test_cache: Path):  # type: ignore[no-untyped-def]
    """The one real driver build of this test run (proprietary 535 for a current Debian 12 kernel),
    shared by every slow test that needs built artifacts. See tests/support/realbuild.py."""
    from tests.support.realbuild import ensure_real_build

    return ensure_real_build(test_cache)


@pytest.fixture(scope="session")
def oci_registry(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One real registry per test session (Debian's docker-registry on loopback, TLS with a test CA,
    htpasswd auth); see tests/support/registry.py. Stopped at the end of the session."""
    from tests.support.registry import start_registry

    reg = start_registry(tmp_path_factory.mktemp("oci-registry"))
    try:
        yield reg
    finally:
        reg.stop()


@pytest.fixture(scope="session")
def control_plane(test_cache: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager; v1.24.0-alpha.3)
    on loopback for the whole test session; skipped when NODEPREP_K8S_BIN is not set.
    See tests/support/controlplane.py."""
    from tests.support import controlplane as cpmod

    reason = cpmod.skip_reason()
    if reason:
        pytest.skip(reason)
    with cpmod.control_plane(tmp_path_factory.mktemp("controlplane"), test_cache) as cp:
        yield cp


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """A failed test that used the control plane gets the components' log tails in its report."""
    outcome = yield
    rep = outcome.get_result()
    cp = getattr(item, "funcargs", {}).get("control_plane")
    if rep.failed and cp is not None:
        rep.sections.append(("control plane logs", cp.log_tails()))
