"""A lone clone passes its tests: no test, bench, script or product file reads beside the repository.

Two checks: a static scan of the tree for paths that leave the checkout (`REPO.parent`, `../shared`,
`Path(__file__).parents[N]` above the root, ...), and the run-time guard of tests/conftest.py
(an audit hook, tests/support/boundary.py) which fails any test that opens, lists or runs a path in
the repository's sibling tree; it is exercised here on real `open` calls.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import boundary
from tests.support.fixtures import NVIDIA_SMI, REPO

SCANNED_DIRS = ("nodeprep", "tests", "bench", "scripts", "acceptance", "roles", "collections", "playbooks",
                "inventories", "images", "examples", ".ci")
SUFFIXES = {".py", ".sh", ".yml", ".yaml", ".j2", ".cfg", ".toml", ".ini", ".json", ""}
ESCAPES = [
    (re.compile(r"\b[A-Z_]*(?:REPO|ROOT|CHECKOUT)\.parent\b"), "the repository's parent directory"),
    (re.compile(r"\.\./+shared\b"), "../shared"),
    (re.compile(r"""["']shared["']\s*/\s*["']fixtures"""), "shared/fixtures beside the repository"),
    (re.compile(r"/work/(?:shared|main|wt-|\.library|\.mirror)"), "a path of the workplace"),
]
# Files allowed to name a path beside the checkout, when they read it only through a variable: CI's
# entry point exports NODEPREP_K8S_BIN (../shared/k8s, real Kubernetes binaries), NODEPREP_NVIDIA_BIN
# (../shared/nvidia, NVIDIA's GPU stack), NODEPREP_NVIDIA_OPEN (../shared/nvidia-open, NVIDIA's
# open-gpu-kernel-modules releases), NODEPREP_MOCKNVML (../shared/mocknvml, NVIDIA's NVML mock) and
# NODEPREP_NVIDIA_COMPANIONS (../shared/nvidia-companions) when they are there, the support modules
# read those variables (their tests skip without them); the run-time guard allows what a NODEPREP_*
# variable names.
ALLOWED = {".ci/run": ("NODEPREP_K8S_BIN", "NODEPREP_NVIDIA_BIN", "NODEPREP_NVIDIA_OPEN",
                       "NODEPREP_MOCKNVML", "NODEPREP_NVIDIA_COMPANIONS"),
           "tests/support/controlplane.py": ("NODEPREP_K8S_BIN",),
           "tests/support/nvidia.py": ("NODEPREP_NVIDIA_BIN",),
           "tests/support/mocknvml.py": ("NODEPREP_MOCKNVML",),
           "tests/support/companions.py": ("NODEPREP_NVIDIA_COMPANIONS",)}
FILE_PARENTS = re.compile(r"Path\(__file__\)(?:\.resolve\(\))?((?:\.parent\b)+|\.parents\[(\d+)\])")


def scanned_files() -> list[Path]:
    files = []
    for top in SCANNED_DIRS:
        for path in sorted((REPO / top).rglob("*")):
            if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts \
                    and path.stat().st_size < 1_000_000 and path != Path(__file__).resolve():
                files.append(path)
    return files + [REPO / "pyproject.toml"]


def escapes(path: Path) -> list[str]:
    """Lines of `path` that name a place outside the repository."""
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        return []
    found = []
    allowed = ALLOWED.get(path.relative_to(REPO).as_posix())
    if allowed is not None and all(name in text for name in allowed):
        return []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern, what in ESCAPES:
            if pattern.search(line):
                found.append(f"{path.relative_to(REPO)}:{number}: {what}: {line.strip()}")
        for m in FILE_PARENTS.finditer(line):
            up = int(m.group(2)) + 1 if m.group(2) is not None else m.group(1).count(".parent")
            target = path.parents[up - 1] if up <= len(path.parents) else Path("/")
            if not target.is_relative_to(REPO):
                found.append(f"{path.relative_to(REPO)}:{number}: Path(__file__) {up} levels up leaves the "
                             f"repository: {line.strip()}")
    return found


def test_no_file_names_a_path_beside_the_repository() -> None:
    files = scanned_files()
    assert len(files) > 100 and REPO / "tests/conftest.py" in files
    found = [hit for path in files for hit in escapes(path)]
    assert not found, "files that read beside the repository:\n" + "\n".join(found)


def test_scan_catches_each_escape(tmp_path: Path) -> None:
    """The scan is not vacuous: each forbidden form in a file inside the tree is reported."""
    probe = REPO / "tests" / "unit" / f".boundary-probe-{os.getpid()}.py"
    lines = ['X = REPO.parent / "shared"', 'Y = "../shared/fixtures/a.xml"', 'Z = Path(__file__).parents[3]',
             'W = Path(__file__).resolve().parent.parent.parent.parent', 'V = "/work/shared/k8s"',
             'U = Path(__file__).resolve().parents[1]']
    probe.write_text("\n".join(lines) + "\n")
    try:
        found = escapes(probe)
    finally:
        probe.unlink()
    assert [int(hit.split(":")[1]) for hit in found] == [1, 2, 3, 4, 5]


def test_runtime_guard_records_sibling_reads_only(repository_boundary: boundary.Guard,
                                                  tmp_path: Path) -> None:
    """Real `open`/`listdir`/subprocess calls: a sibling of the checkout is recorded (it need not exist,
    the audit event comes before the failure), the repository, /tmp, /usr and /proc are not."""
    sibling = REPO.parent / f"nodeprep-boundary-probe-{os.getpid()}"
    with pytest.raises(FileNotFoundError):
        open(sibling / "x.xml", "rb")  # noqa: SIM115
    with pytest.raises(FileNotFoundError):
        os.listdir(sibling)
    (tmp_path / "f").write_text("ok")
    (tmp_path / "link").symlink_to("../../run")  # a link's target is text, not a path touched
    (REPO / "pyproject.toml").read_bytes()
    Path("/proc/self/status").read_text()
    Path("/usr/lib/os-release").read_text()
    hits = repository_boundary.take()
    assert hits == [("open", str(sibling / "x.xml")), ("os.listdir", str(sibling))]
    if REPO.parent != Path("/"):
        rel = os.path.relpath(sibling, Path.cwd())
        with pytest.raises(FileNotFoundError):
            open(rel)  # noqa: SIM115  relative paths are resolved against the cwd
        subprocess.run([sys.executable, "-c", "pass", str(REPO.parent)], check=True)
        assert repository_boundary.take() == [("open", str(sibling)), ("subprocess.Popen", str(REPO.parent))]


def test_paths_named_by_the_environment_are_allowed(tmp_path: Path) -> None:
    """A NODEPREP_* variable may point beside the checkout on purpose (CI's reference data); only
    that path is allowed, its siblings stay forbidden."""
    repo = tmp_path / "nodeprep"
    named = str(tmp_path / "shared" / "k8s")
    allowed = boundary.allowed_by_env({"NODEPREP_TEST_K8S": named, "HOME": str(tmp_path / "home"),
                                       "NODEPREP_TEST_CACHE": "/var/cache/nodeprep-tests"})
    guard = boundary.Guard(repo, allowed)
    assert guard.forbidden(f"{named}/v1.31/kube-apiserver") is None and guard.forbidden(named) is None
    assert guard.forbidden(str(tmp_path / "shared" / "fixtures")) == str(tmp_path / "shared" / "fixtures")
    assert guard.forbidden(str(tmp_path / "home" / "x")) == str(tmp_path / "home" / "x")
    assert guard.forbidden(str(repo / "tests")) is None and guard.forbidden("/usr/lib") is None


def test_guard_fails_a_test_that_reads_beside_the_repository(tmp_path: Path) -> None:
    """The whole mechanism, end to end: a pytest run in this checkout of a test that opens a sibling
    path fails, naming the path; the same test reading inside the repository passes."""
    probe = REPO / "tests" / "unit" / f"test_boundary_probe_{os.getpid()}.py"
    probe.write_text(
        "from pathlib import Path\n"
        "REPO = Path(__file__).resolve().parents[2]\n"
        "def test_outside():\n"
        "    try:\n"
        "        (REPO.parent / 'nodeprep-boundary-probe' / 'a.xml').read_bytes()\n"
        "    except FileNotFoundError:\n"
        "        pass\n"
        "def test_inside():\n"
        "    (REPO / 'pyproject.toml').read_bytes()\n")
    try:
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(probe)],
                             cwd=REPO, capture_output=True, text=True, timeout=120)
    finally:
        probe.unlink()
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 failed, 1 passed" in run.stdout
    assert f"open {REPO.parent / 'nodeprep-boundary-probe' / 'a.xml'}" in run.stdout


def test_fixture_copies_match_their_sources() -> None:
    """The captures are byte-for-byte the upstream files listed (sha256 and size) in SOURCES.md,
    which keeps the MIT notice."""
    sources = (NVIDIA_SMI / "SOURCES.md").read_text()
    assert "Permission is hereby granted, free of charge" in sources and "InfluxData Inc." in sources
    rows = re.findall(r"^\| `([^`]+\.xml)` \|.*\| `([0-9a-f]{64})` \| (\d+) \|$", sources, re.M)
    xmls = sorted(p.name for p in NVIDIA_SMI.glob("*.xml"))
    assert sorted(name for name, _, _ in rows) == xmls and len(xmls) == 5
    for name, sha, size in rows:
        data = (NVIDIA_SMI / name).read_bytes()
        assert (hashlib.sha256(data).hexdigest(), len(data)) == (sha, int(size)), name
