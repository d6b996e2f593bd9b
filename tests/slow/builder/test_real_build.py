"""The real build (proprietary 535 for Debian 12's current kernel, shared through the real_build
fixture: one full compile per test run on a fresh cache) and what build-driver promises about it."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from nodeprep import artifact, runner

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]


def cli(*args: str, env: dict[str, str] | None = None, check: bool = False, timeout: float = 3600):
    return runner.run(
        [sys.executable, "-m", "nodeprep.cli", *args],
        check=check,
        timeout=timeout,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), **(env or {})},
    )


def build_again(real_build, *extra: str):  # type: ignore[no-untyped-def]
    """`build-driver` of the shared real build's driver and kernel into its store and cache (no smoke
    test), plus `extra`; must exit 0."""
    return cli(
        "build-driver",
        "--driver",
        real_build.driver_version,
        "--kernel",
        real_build.kernel_release,
        "--store",
        str(real_build.store),
        "--cache",
        str(real_build.cache),
        "--no-smoke-test",
        *extra,
        check=True,
        timeout=600,
    )


def test_modules_are_built_for_the_target_kernel(real_build, tmp_path):
    out = tmp_path / "x"
    out.mkdir()
    manifest = artifact.extract(real_build.kmod, out)
    moddir = out / "modules" / real_build.kernel_release
    names = sorted(p.name for p in moddir.iterdir())
    assert {"nvidia.ko", "nvidia-uvm.ko", "nvidia-modeset.ko", "nvidia-drm.ko"} <= set(names)
    for ko in moddir.iterdir():
        vermagic = runner.run(["modinfo", "-F", "vermagic", ko]).stdout.strip()
        assert vermagic.startswith(real_build.kernel_release + " "), (ko.name, vermagic)
        sections = runner.run(["objdump", "-h", ko]).stdout
        assert ".debug_info" not in sections, f"{ko.name} is not stripped"
    assert (
        runner.run(["modinfo", "-F", "version", moddir / "nvidia.ko"]).stdout.strip()
        == real_build.driver_version
    )
    assert manifest.vermagic == runner.run(["modinfo", "-F", "vermagic", moddir / "nvidia.ko"]).stdout.strip()
    assert manifest.kernel_release == real_build.kernel_release and manifest.flavour == "proprietary"
    assert manifest.compiler and manifest.compiler.startswith("gcc-12 ")
    assert manifest.extra["build"]["path"] == "/build/kernel"


def test_manifest_hashes_match_files_and_inputs(real_build, tmp_path):
    out = tmp_path / "x"
    out.mkdir()
    manifest = artifact.extract(real_build.kmod, out)  # checks every file's sha256 while extracting
    for rel, entry in manifest.files.items():
        assert artifact.sha256_file(out / rel) == entry.sha256
        assert (out / rel).stat().st_size == entry.size
    debs = {n: s for n, s in manifest.inputs.items() if n.endswith(".deb")}
    assert any(n.startswith("nvidia-kernel-source_") for n in debs)
    assert any(n.startswith(f"linux-headers-{real_build.kernel_release}_") for n in debs)
    assert any(n.startswith("linux-kbuild-") for n in debs)
    for name, sha in debs.items():
        assert artifact.sha256_file(real_build.cache / "debs" / name) == sha
    index = json.loads((real_build.store / "index.json").read_text())
    entry = next(e for e in index["artifacts"] if e["name"] == real_build.kmod.name)
    assert entry["sha256"] == artifact.sha256_file(real_build.kmod)
    assert entry["input_digest"] == manifest.input_digest == real_build.input_digest
    assert manifest.extra["build_root"]["packages"] and any(
        p.startswith("gcc-12:amd64=") for p in manifest.extra["build_root"]["packages"]
    )


def test_object_count_matches_what_make_compiled(real_build, tmp_path):
    """The total of the compile progress (Kbuild object lists) is the number of `CC [M]` lines the
    real compile of this cache printed (its log is kept under <cache>/logs). Runs before the
    SIGTERM test below, which leaves a partial log of the same name."""
    import re

    from nodeprep.builder import kbuild

    log = real_build.cache / "logs" / f"{real_build.kmod.name.removesuffix('.tar.zst')}.log"
    text = log.read_text() if log.is_file() else ""
    if not re.search(r"^\s*LD \[M\]\s+\S*/nvidia\.ko$", text, re.M):
        pytest.skip(f"no complete compile log in {log} (a warm cache from an interrupted run)")
    manifest = artifact.read_manifest(real_build.kmod)
    deb = next(
        real_build.cache / "debs" / n for n in manifest.inputs if n.startswith("nvidia-kernel-source_")
    )
    runner.run(["dpkg-deb", "-x", deb, tmp_path])
    runner.run(["tar", "-xJf", next((tmp_path / "usr" / "src").glob("*.tar.xz")), "-C", tmp_path])
    tree = next(p.parent for p in (tmp_path / "modules").glob("*/Kbuild"))
    compiled = sum(1 for ln in text.splitlines() if kbuild.CC_LINE_RE.match(ln))
    assert compiled > 100 and kbuild.count_objects(tree) == compiled


def test_second_run_is_a_cache_hit_without_compiling(real_build):
    """Through the CLI with --json: same inputs -> "cached": true, no compiler started (the build
    log and the compiled-modules cache stay untouched) and the very same bytes in the store."""
    before = artifact.sha256_file(real_build.kmod)
    logs = sorted((real_build.cache / "logs").glob("*.log"))
    stamps = {p: p.stat().st_mtime_ns for p in logs}
    builds = sorted(p.name for p in (real_build.cache / "kmod-builds").iterdir())
    res = build_again(real_build, "--json", "--flavour", real_build.flavour)
    summary = json.loads(res.stdout)
    assert summary["cached"] is True and summary["compiled"] is False and summary["log"] is None
    assert summary["name"] == real_build.kmod.name and summary["input_digest"] == real_build.input_digest
    assert summary["sha256"] == before == artifact.sha256_file(real_build.kmod)
    assert {p: p.stat().st_mtime_ns for p in logs} == stamps
    assert sorted(p.name for p in (real_build.cache / "kmod-builds").iterdir()) == builds
    assert "Compiling" not in res.stderr


def test_artifacts_verify_catches_one_flipped_byte(real_build, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(real_build.store, store, ignore=shutil.ignore_patterns(".lock", ".*.tmp"))
    res = cli("artifacts", "verify", str(store))
    assert res.returncode == 0, res.stdout + res.stderr
    listing = cli("artifacts", "list", str(store), "--json", check=True)
    assert real_build.kmod.name in {e["name"] for e in json.loads(listing.stdout)}
    victim = store / real_build.kmod.name
    with open(victim, "r+b") as f:
        f.seek(victim.stat().st_size // 3)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x40]))
    res = cli("artifacts", "verify", str(store))
    assert res.returncode == 1
    lines = res.stdout.strip().splitlines()
    assert lines and all(line.startswith(victim.name + ":") for line in lines), lines
    assert any("does not match index.json" in line for line in lines)


@pytest.mark.parametrize(
    "option, value, error, served, also",
    [
        ("--driver", "999.99.99", "error: --driver: driver 999.99.99 (proprietary) is not served",
         "driver_version", "open: "),
        ("--kernel", "6.1.0-999-amd64", "error: --kernel: no headers for kernel '6.1.0-999-amd64'",
         "kernel_release", ""),
    ],
)
def test_unknown_driver_and_kernel_against_the_real_archive(
    real_build, tmp_path, option, value, error, served, also
):
    """One error line naming the option and what the real archive does serve (the real build's
    `served` field); no artifact written."""
    res = cli(
        "build-driver",
        option,
        value,
        "--store",
        str(tmp_path / "s"),
        "--cache",
        str(real_build.cache),
        "--no-smoke-test",
    )
    assert res.returncode == 2
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith(error)
    assert getattr(real_build, served) in line and also in line
    assert not (tmp_path / "s").exists() or not any((tmp_path / "s").glob("*.tar.zst"))


def test_build_matrix_builds_cells_in_parallel(real_build, tmp_path):
    """`build-matrix --build -j 2`: the real build's cell is a cache hit in a copy of the store, a cell
    with an unknown kernel fails on its own; index.json stays consistent; exit 1 for the failure."""
    store = tmp_path / "store"
    shutil.copytree(real_build.store, store, ignore=shutil.ignore_patterns(".lock"))
    f = tmp_path / "matrix.yaml"
    f.write_text(
        f"os: {real_build.os_name}\ndrivers: [{real_build.driver_version}]\n"
        f"kernels: [{real_build.kernel_release}, 6.1.0-999-amd64]\nflavours: [proprietary]\n"
    )
    res = cli(
        "build-matrix",
        str(f),
        "--build",
        "-j",
        "2",
        "--store",
        str(store),
        "--cache",
        str(real_build.cache),
        "--no-smoke-test",
        "--json",
    )
    assert res.returncode == 1, res.stderr[-2000:]
    data = json.loads(res.stdout)
    assert data["failed"] == 1
    ok = next(r for r in data["results"] if r["ok"])
    bad = next(r for r in data["results"] if not r["ok"])
    assert ok["cached"] is True and ok["name"] == real_build.kmod.name
    assert bad["cell"]["kernel"] == "6.1.0-999-amd64" and bad["error"].startswith("--kernel: no headers")
    assert cli("artifacts", "verify", str(store)).returncode == 0


def test_unreachable_archive_is_one_line(tmp_path):
    """A Debian mirror that does not answer (a closed loopback port): exit 1 with one line naming
    it, nothing written to the store, no temporary directory left."""
    cache, store = tmp_path / "cache", tmp_path / "store"
    res = cli(
        "build-driver",
        "--store",
        str(store),
        "--cache",
        str(cache),
        "--no-smoke-test",
        env={
            "NODEPREP_DEBIAN_MIRROR": "http://127.0.0.1:9/debian",
            "NODEPREP_DEBIAN_SECURITY_MIRROR": "http://127.0.0.1:9/debian-security",
        },
        timeout=600,
    )
    assert res.returncode == 1
    err = [ln for ln in res.stderr.splitlines() if ln.startswith("error: ")]
    assert len(err) == 1 and err[0].startswith(
        "error: Debian archive http://127.0.0.1:9/debian unreachable"
    ), res.stderr
    assert not store.exists()
    assert not (cache / "tmp").exists() or not list((cache / "tmp").iterdir())


def test_build_matrix_sigterm_stops_every_cell(real_build, tmp_path):
    """SIGTERM to `build-matrix --build` while a cell compiles: the worker's compiler is killed, its
    workspace removed, nothing published, exit 130 (costs the first seconds of one compile)."""
    import signal
    import subprocess  # noqa: PLC0415 - the test sends a real signal mid-build

    store = tmp_path / "store"
    f = tmp_path / "matrix.yaml"
    f.write_text(f"drivers: [{real_build.driver_version}]\nkernels: [{real_build.kernel_release}]\n")
    argv = [
        sys.executable,
        "-m",
        "nodeprep.cli",
        "build-matrix",
        str(f),
        "--build",
        "--rebuild",
        "--no-userspace",
        "--no-smoke-test",
        "--store",
        str(store),
        "--cache",
        str(real_build.cache),
    ]
    proc = subprocess.Popen(
        argv,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("==> Compiling"):
            break
    import time

    time.sleep(3)
    proc.send_signal(signal.SIGTERM)
    rest = proc.stderr.read()
    assert proc.wait(timeout=180) == 130, rest
    assert "error: interrupted" in rest
    assert not (real_build.cache / "tmp").exists() or not list((real_build.cache / "tmp").iterdir())
    assert not store.exists() or not list(store.glob("*.tar.zst"))


def test_closing_summary_names_the_next_steps_and_they_run(real_build, tmp_path):
    """Without --json the summary ends with the next steps; the printed throwaway-root install
    command, run as printed (only its --root moved into tmp), installs the driver."""
    import shlex

    res = build_again(real_build)
    lines = res.stderr.splitlines()
    steps = lines[lines.index("next steps:") + 1 :]
    smoke = shlex.split(next(ln for ln in steps if "smoke test" in ln).split(":  ", 1)[1])
    assert smoke == ["nodeprep", "smoke-test", str(real_build.kmod), "--cache", str(real_build.cache)]
    install = shlex.split(next(ln for ln in steps if "throwaway root" in ln).split(":  ", 1)[1])
    assert install[:2] == ["nodeprep", "install"] and "--root" in install
    assert install[install.index("--store") + 1] == str(real_build.store.resolve())
    assert install[install.index("--driver") + 1] == real_build.driver_version
    assert install[install.index("--kernel") + 1] == real_build.kernel_release
    root = tmp_path / "root"
    install[install.index("--root") + 1] = str(root)
    root.mkdir()  # as the line says: --root must exist
    done = cli(*install[1:], timeout=600)
    assert done.returncode == 0, done.stderr
    moddir = root / "opt" / "nvidia" / real_build.driver_version / "modules" / real_build.kernel_release
    assert (moddir / "nvidia.ko").is_file()
    cloud = next(ln for ln in steps if "cloud nodes" in ln)
    assert f"driver.version {real_build.driver_version}" in cloud and "nodeprep cloud-init --profile" in cloud
