"""nvidia-persistenced 535.309.01 built from NVIDIA's source (the `git archive` of its tag, from
NODEPREP_NVIDIA_COMPANIONS) in the shared real build's Debian 12 build root, through
`build-driver --persistenced-source`: the kernel modules are the shared build's (reused by their
compile key: no kernel compile), persistenced is a plain make of a small C program (seconds). No GPU
is involved: the binary's version is read from its bytes and from `--version` run in the build root."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from nodeprep import artifact, runner
from nodeprep.builder import buildroot, persistenced, userspace
from nodeprep.targets import get
from tests.support import companions

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
VERSION = "535.309.01"
ARCHIVE = f"nvidia-persistenced-{VERSION}.tar.gz"


def cli(*args: str, timeout: float = 900) -> runner.Result:
    env = {k: v for k, v in os.environ.items() if k != "NODEPREP_CRASH_AT"}
    return runner.run([sys.executable, "-m", "nodeprep.cli", *args], check=False, timeout=timeout, cwd=REPO,
                      env={**env, "PYTHONPATH": str(REPO)})


@pytest.fixture(scope="module")
def source() -> Path:
    found = companions.archive(ARCHIVE)
    if isinstance(found, str):
        pytest.skip(found)
    return found


def test_persistenced_is_built_at_the_drivers_version_into_the_user_space(real_build, source: Path,
                                                                          tmp_path: Path) -> None:
    if real_build.driver_version != VERSION:
        pytest.skip(f"the shared build is driver {real_build.driver_version}; the archive here is {VERSION}")
    store = tmp_path / "store"
    r = cli("build-driver", "--driver", VERSION, "--kernel", real_build.kernel_release, "--store", str(store),
            "--cache", str(real_build.cache), "--no-smoke-test", "--persistenced-source", str(source),
            "--persistenced-sha256", companions.ARCHIVES[ARCHIVE], "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["compiled"] is False  # the shared build's modules, found by their compile key
    assert not [n for n in out["notes"] if "nvidia-persistenced" in n]  # no version warning: it matches
    us = Path(out["userspace"])
    payload = tmp_path / "payload"
    payload.mkdir()
    manifest = artifact.extract(us, payload)
    binary = payload / "bin" / "nvidia-persistenced"
    assert persistenced.embedded_version(binary.read_bytes()) == VERSION
    record = manifest.extra["persistenced"]
    assert record["from"] == "source" and record["version"] == VERSION and record["source"] == ARCHIVE
    assert manifest.inputs[ARCHIVE] == companions.ARCHIVES[ARCHIVE]
    # what `nvidia-persistenced --version` prints, run in the build root it was built in
    target = get("debian-12")
    build_root = buildroot.ensure(buildroot.recipe_for(target, None), real_build.cache, mirror="unused")
    with buildroot.workspace(build_root, real_build.cache / "tmp") as clone:
        (clone / "tmp" / "nvidia-persistenced").write_bytes(binary.read_bytes())
        (clone / "tmp" / "nvidia-persistenced").chmod(0o755)
        said = runner.run(["/tmp/nvidia-persistenced", "--version"], root=clone, check=False)
    assert f"version {VERSION}" in said.stdout + said.stderr, said

    # Debian's own 535.171.04 is what the shared build's artifact has: the warning names both
    shared = artifact.read_manifest(real_build.userspace)
    assert "535.171.04" in str(userspace.persistenced_warning(shared))

    # installed into a root: the versioned root holds it, the unit runs it through `current`
    node = tmp_path / "node"
    for d in ("etc/systemd/system/multi-user.target.wants", "usr/bin", "usr/lib/x86_64-linux-gnu",
              f"lib/modules/{real_build.kernel_release}/kernel", "var/lib", "opt"):
        (node / d).mkdir(parents=True, exist_ok=True)
    r = cli("install", "--store", str(store), "--driver", VERSION, "--kernel", real_build.kernel_release,
            "--activate", "--root", str(node), "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    installed = node / "opt" / "nvidia" / VERSION / "bin" / "nvidia-persistenced"
    assert installed.read_bytes() == binary.read_bytes()
    unit = (node / "etc/systemd/system/nodeprep-persistenced.service").read_text()
    assert "ExecStart=/opt/nvidia/current/bin/nvidia-persistenced" in unit
    link = os.readlink(node / "usr/bin/nvidia-persistenced")
    assert link == "../../opt/nvidia/current/bin/nvidia-persistenced"


def test_without_a_source_the_build_keeps_debians_and_warns_once(real_build) -> None:
    """The shared build's user space (Debian's packages): one warning line naming both versions."""
    r = cli("build-driver", "--driver", real_build.driver_version, "--kernel", real_build.kernel_release,
            "--store", str(real_build.store), "--cache", str(real_build.cache), "--no-smoke-test", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [ln for ln in r.stderr.splitlines() if "nvidia-persistenced" in ln]
    assert len(lines) == 1, lines
    assert lines[0].startswith("warning: nvidia-persistenced 535.171.04 (Debian's "), lines
    assert f"is not the driver's {real_build.driver_version}" in lines[0]


def test_fabric_manager_of_the_drivers_version_goes_into_the_user_space(real_build, tmp_path: Path) -> None:
    """NVIDIA's Fabric Manager archive packed in its real layout around stand-in binaries
    (tests/support/fmarchive.py: no real archive is reachable here), through build-driver on the
    shared build (modules reused); one of another version is refused before anything is built."""
    from tests.support import fmarchive

    version = real_build.driver_version
    archive = fmarchive.pack(tmp_path / "fm", version)
    sha = artifact.sha256_file(archive)
    store = tmp_path / "store"
    r = cli("build-driver", "--driver", version, "--kernel", real_build.kernel_release, "--store", str(store),
            "--cache", str(real_build.cache), "--no-smoke-test", "--fabricmanager", str(archive),
            "--fabricmanager-sha256", sha, "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    us = Path(json.loads(r.stdout)["userspace"])
    payload = tmp_path / "payload"
    payload.mkdir()
    manifest = artifact.extract(us, payload)
    assert manifest.extra["fabricmanager"]["version"] == version and manifest.inputs[archive.name] == sha
    assert (payload / "bin/nv-fabricmanager").read_bytes()[:4] == b"\x7fELF"
    assert (payload / "share/nvidia/nvswitch/dgxh100_hgxh100_topology").is_file()
    other = fmarchive.pack(tmp_path / "fm2", "590.48.01")
    r = cli("build-driver", "--driver", version, "--kernel", real_build.kernel_release, "--store",
            str(tmp_path / "store2"), "--cache", str(real_build.cache), "--no-smoke-test", "--fabricmanager",
            str(other), "--fabricmanager-sha256", artifact.sha256_file(other))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        f"error: --fabricmanager: {other.name} is Fabric Manager 590.48.01, the driver is {version}: Fabric "
        "Manager must be the driver's exact version")
    assert not (tmp_path / "store2").exists()
