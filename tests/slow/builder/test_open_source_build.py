"""Real builds from NVIDIA's open-gpu-kernel-modules releases (`build-driver --open-source`, issue 27).

The release tarballs are reached only through NODEPREP_NVIDIA_OPEN (`.ci/run` sets it; the tests skip
without it). Each cell of tests/support/realbuild.py OPEN_SOURCE_CELLS compiles once per test cache,
with the qemu smoke boot on its own kernel (input-digest hits afterwards): 580.142 for Debian 12's
6.1.0-56 and for Debian 13's 6.12.117, 595.45.04 for Debian 13's 6.12.117 (the newest kernel it builds
for: trixie-backports' 7.x kernels are refused with the compiler's reason). The Debian 13 cells and
595.45.04 for trixie-backports' 7.3.4 are also resolved to their plans against the real archive
(headers, build root, version from the tarball) without a compile."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from nodeprep import artifact, runner, targets
from nodeprep.builder import kbuild
from nodeprep.builder.resolve import BuildRequest, resolve_inputs, validate_request
from nodeprep.sources import opensource
from nodeprep.sources.debian import DebianArchive
from tests.support import supporttable
from tests.support.realbuild import (
    OPEN_RELEASES,
    OPEN_SOURCE_CELLS,
    ensure_open_source_cell,
    open_release,
)

pytestmark = pytest.mark.slow
CELL = "debian12-open-580"
MODULES = ["nvidia-drm.ko", "nvidia-modeset.ko", "nvidia-peermem.ko", "nvidia-uvm.ko", "nvidia.ko"]


def release_or_skip(version: str) -> tuple[Path, str]:
    found = open_release(version)
    if isinstance(found, str):
        pytest.skip(found)
    return found


def modinfo(ko: Path, field: str) -> str:
    return runner.run(["modinfo", "-F", field, ko]).stdout.strip()


# the compiler of each cell's kernel (its line's, nodeprep.targets): (package, what m.compiler starts with)
COMPILERS = {"debian-12": ("gcc-12", "gcc-12 (Debian 12.2.0-14"),
             "debian-13": ("gcc-14", "x86_64-linux-gnu-gcc-14 (Debian 14.")}


@pytest.mark.parametrize("cell", sorted(OPEN_SOURCE_CELLS))
def test_open_source_cell_builds_and_loads_up_to_the_gpu_probe(cell: str, test_cache: Path,
                                                                tmp_path: Path) -> None:
    spec = OPEN_SOURCE_CELLS[cell]
    path, sha = release_or_skip(spec["release"])
    built = ensure_open_source_cell(test_cache, cell)
    m = artifact.extract(built.kmod, tmp_path)
    assert (m.os, m.flavour, m.driver_version, m.kernel_release) == (
        spec["os_name"], "open", spec["release"], spec["kernel"])
    # the input digest is over the tarball itself (and the kernel's header packages)
    assert m.inputs[path.name] == sha
    assert m.extra["source"] == {"kind": "open-source", "name": path.name, "sha256": sha}
    # the release's own Makefiles run xz and a C++ compiler: the build root has them beside the gcc
    gcc, text = COMPILERS[spec["os_name"]]
    names = {p.split(":")[0].split("=")[0] for p in m.extra["build_root"]["packages"]}
    assert {"xz-utils", gcc.replace("gcc", "g++"), gcc} <= names, names
    assert m.compiler.startswith(text) and "cc_mismatch" not in m.extra["build"], m.compiler
    mod_dir = tmp_path / "modules" / spec["kernel"]
    assert sorted(p.name for p in mod_dir.iterdir()) == MODULES
    for ko in MODULES:
        assert modinfo(mod_dir / ko, "vermagic").startswith(f"{spec['kernel']} SMP "), ko
    assert modinfo(mod_dir / "nvidia.ko", "version") == spec["release"]
    assert modinfo(mod_dir / "nvidia.ko", "license") == "Dual MIT/GPL"
    # progress counts every object both kinds of Makefile print (NVIDIA's src/, then kbuild)
    log = test_cache / "logs" / f"{built.kmod.name.removesuffix('.tar.zst')}.log"
    if built.compiled:
        printed = [ln for ln in log.read_text().splitlines()
                   if kbuild.CC_LINE_RE.match(ln) or kbuild.NV_LINE_RE.match(ln)]
        assert len(printed) == kbuild.count_objects(opensource.extract_tree(path, tmp_path / "tree"))
    smoke = m.extra["smoke_test"]
    # the verdict of the boot during the build, kept for docs/build.md's support table
    supporttable.record_smoke(test_cache, cell, kmod=built.kmod, input_digest=built.input_digest,
                              verdict=smoke["verdict"])
    assert smoke["verdict"] == "PASS", smoke
    assert "loaded up to the GPU probe" in smoke["reason"], smoke


def test_same_release_from_the_cli_is_a_store_hit(test_cache: Path) -> None:
    """`build-driver --open-source FILE --open-source-sha256 HEX` (no --flavour: a release builds the
    open flavour) finds the cell's artifact by its input digest: nothing compiles; and a wrong
    sha256 is refused before anything is built."""
    spec = OPEN_SOURCE_CELLS[CELL]
    path, sha = release_or_skip(spec["release"])
    built = ensure_open_source_cell(test_cache, CELL)
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    base = [sys.executable, "-m", "nodeprep.cli", "build-driver", "--os", spec["os_name"], "--kernel",
            spec["kernel"], "--store", built.store, "--cache", test_cache, "--no-userspace", "--json",
            "--open-source", path]
    hit = runner.run([*base, "--open-source-sha256", sha], check=False, timeout=600, env=env)
    assert hit.returncode == 0, hit.stderr
    data = json.loads(hit.stdout)
    assert data["cached"] is True and data["compiled"] is False
    assert data["input_digest"] == built.input_digest and data["flavour"] == "open"
    wrong = runner.run([*base, "--open-source-sha256", "0" * 64], check=False, timeout=600, env=env)
    last = wrong.stderr.strip().splitlines()[-1]
    assert wrong.returncode == 2 and last.startswith("error: "), wrong.stderr
    assert f"sha256 {sha} does not match the expected {'0' * 64}" in last and "Traceback" not in wrong.stderr


@pytest.mark.parametrize("version, os_name, kernel", [
    ("580.142", "debian-13", "6.12.117+deb13-amd64"),
    ("595.45.04", "debian-13", "6.12.117+deb13-amd64"),
    ("595.45.04", "debian-13", "7.3.4+deb13-amd64"),  # trixie-backports' line (nodeprep.targets)
])
def test_other_cells_resolve_to_their_plans(version: str, os_name: str, kernel: str,
                                            test_cache: Path) -> None:
    """The issue's other cells, planned against the real archive without a compile: the version comes
    from the tarball, the headers from the target's archive."""
    path, sha = release_or_skip(version)
    req = BuildRequest(flavour="open", target=targets.get(os_name), kernel=kernel, open_source=str(path),
                       open_source_sha256=sha, cache=test_cache, store=test_cache / "unused-store",
                       userspace=False, smoke_test=False)
    validate_request(req)
    resolved, src = resolve_inputs(req, DebianArchive(test_cache, os_name=os_name, kernel=kernel))
    assert src is not None and src.name == path.name
    assert (resolved.driver_version, resolved.flavour, resolved.kernel_release) == (version, "open", kernel)
    assert resolved.source["kind"] == "open-source" and "source" not in resolved.debs
    assert any(p == f"linux-headers-{kernel}" for p, _ in resolved.header_packages)
    assert OPEN_RELEASES[version] == sha


def test_trixie_backports_kernels_refuse_the_releases_with_the_compilers_reason(test_cache: Path,
                                                                                tmp_path: Path) -> None:
    """595.45.04 compiled for 7.3.4+deb13 (2026-11-26) failed: `fatal error: linux/of_gpio.h: No such
    file or directory` (nv-linux.h includes it; 7.2 and later removed it). `build-matrix --expand
    --by-kernel` lists every trixie-backports kernel with both releases refused for that reason, and
    the cells the line's own driver makes."""
    releases = "".join(f"  - {{release: /r/open-gpu-kernel-modules-{v}.tar.gz, sha256: {sha}}}\n"
                       for v, sha in OPEN_RELEASES.items())
    f = tmp_path / "matrix.yaml"
    f.write_text("os: debian-13\nkernels: [{channel: backports, newest: 2}]\nopen_source:\n" + releases)
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    res = runner.run([sys.executable, "-m", "nodeprep.cli", "build-matrix", f, "--expand", "--by-kernel",
                      "--cache", test_cache], check=False, timeout=600, env=env)
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)["kernels"]
    assert len(rows) == 2 and all(r["kernel"].startswith("7.") for r in rows), rows
    for row in rows:
        refused = {r["driver"]: r["reason"] for r in row["refused"]}
        for version in OPEN_RELEASES:
            assert "linux/of_gpio.h" in refused[f"open-gpu-kernel-modules-{version}.tar.gz"], row
        assert not any(b["source"].startswith("open-source:") for b in row["builds"]), row


def test_release_kmod_and_runfile_user_space_install_together(test_cache: Path, tmp_path: Path) -> None:
    """The open flavour from NVIDIA's real 580.142 release (the cell's compile reused through the
    compile cache) plus the user space of an installer of the same version make one installable
    driver: `build-driver --open-source … --runfile …` publishes both into one store, `install
    --activate` puts them into a test root and doctor's state, module and ld-cache checks pass.
    No 580.142 user space is reachable from these machines (NVIDIA's installers are not), so the
    installer is packed like NVIDIA's (makeself, its .manifest: tests/support/makeself.py) around
    real shared objects built here under NVIDIA's 580.142 file names and sonames; the installer
    stands in for NVIDIA's download server's, nothing else does."""
    from tests.support.makeself import make_runfile, nvidia_tree
    from tests.unit.join.conftest import build_payload

    spec = OPEN_SOURCE_CELLS[CELL]
    path, sha = release_or_skip(spec["release"])
    version, kernel = spec["release"], spec["kernel"]
    ensure_open_source_cell(test_cache, CELL)  # the compile the build below reuses
    tree = nvidia_tree(build_payload(tmp_path / "us", version), tmp_path / f"NVIDIA-Linux-x86_64-{version}",
                       version)
    run = make_runfile(tree, tmp_path / f"NVIDIA-Linux-x86_64-{version}.run", compression="gzip", level=1,
                       label=f"NVIDIA Accelerated Graphics Driver for Linux-x86_64 {version}")
    run_sha = artifact.sha256_file(run)
    store = tmp_path / "store"
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    cli = [sys.executable, "-m", "nodeprep.cli"]
    res = runner.run([*cli, "build-driver", "--os", spec["os_name"], "--kernel", kernel, "--store", store,
                      "--cache", test_cache, "--no-smoke-test", "--json", "--open-source", path,
                      "--open-source-sha256", sha, "--runfile", run, "--sha256", run_sha],
                     check=False, timeout=1800, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout)
    assert summary["compiled"] is False and summary["flavour"] == "open", summary
    kmod = artifact.read_manifest(store / summary["name"])
    assert kmod.extra["source"] == {"kind": "open-source", "name": path.name, "sha256": sha}
    us = artifact.read_manifest(Path(summary["userspace"]))
    assert us.driver_version == version and us.inputs == {run.name: run_sha}
    assert us.extra["source"]["kind"] == "runfile"
    root = tmp_path / "root"
    (root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    done = runner.run([*cli, "install", "--store", store, "--driver", version, "--kernel", kernel,
                       "--root", root, "--activate"], check=False, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (root / "opt/nvidia" / version / "lib64" / f"libcuda.so.{version}").is_file()
    links = root / "lib/modules" / kernel / "updates/nodeprep"  # nodeprep.node.layout
    assert sorted(p.name for p in links.iterdir()) == MODULES
    assert modinfo(links / "nvidia.ko", "version") == version
    doctor = runner.run([*cli, "doctor", "--root", root, "--json", "--check", "state",
                         "--check", "ldcache"],
                        check=False, timeout=600, env=env)
    checks = json.loads(doctor.stdout)["checks"]
    assert checks and all(c["ok"] and not c.get("skipped") for c in checks), checks
