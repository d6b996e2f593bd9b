"""Input digest, build parameters, source-tree digest and the kmod manifest/tarball."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest

from nodeprep import artifact, targets
from nodeprep.builder import buildroot, kbuild
from nodeprep.builder.compile import tree_digest
from nodeprep.builder.resolve import BuildRequest, ResolvedInputs, build_params

RESOLVED = ResolvedInputs(
    driver_version="535.309.01",
    flavour="proprietary",
    kernel_release="6.1.0-56-amd64",
    source={"kind": "debian", "package": "nvidia-kernel-source", "version": "535.309.01-0+deb12u1"},
    debs={},
    header_packages=[["linux-headers-6.1.0-56-amd64", "6.1.192-2"]],
)
BUILD_ROOT = buildroot.BuildRoot(
    path=Path("/nonexistent"),
    recipe=buildroot.recipe_for(targets.get("debian-12")),
    packages=("gcc-12:amd64=12.2.0-14+deb12u1", "make:amd64=4.3-4.1"),
)
INPUTS = {"nvidia-kernel-source_535.309.01-0+deb12u1_amd64.deb": "a" * 64}


DEFAULT_REQUEST = BuildRequest()


def digest(req=DEFAULT_REQUEST, resolved=RESOLVED, build_root=BUILD_ROOT, inputs=INPUTS):
    return artifact.input_digest(inputs, build_params(req, resolved, build_root))


def test_digest_is_stable_and_sensitive(tmp_path):
    base = digest()
    assert base == digest()
    assert digest(inputs={**INPUTS, "linux-kbuild-6.1_6.1.192-2_amd64.deb": "b" * 64}) != base
    assert digest(inputs={k: "c" * 64 for k in INPUTS}) != base
    assert digest(build_root=replace(BUILD_ROOT, packages=("gcc-12:amd64=12.2.0-14+deb12u2",))) != base
    assert digest(resolved=replace(RESOLVED, kernel_release="6.1.0-55-amd64")) != base
    assert digest(resolved=replace(RESOLVED, flavour="open")) != base
    assert digest(req=BuildRequest(smoke_test=True)) != base
    cert = tmp_path / "cert.pem"
    cert.write_text("CERT")
    assert digest(req=BuildRequest(sign_cert=cert, sign_key=cert)) != base
    # Where things are stored and how many jobs compile them do not change the artifact.
    assert digest(req=BuildRequest(store=tmp_path / "s", cache=tmp_path / "c", jobs=7, rebuild=True)) == base


def test_runfile_url_is_not_an_input_but_its_bytes_are():
    a = replace(RESOLVED, source={"kind": "runfile", "url": "http://127.0.0.1:1/a.run", "name": "a.run"})
    b = replace(RESOLVED, source={"kind": "runfile", "url": "http://127.0.0.1:2/a.run", "name": "a.run"})
    assert digest(resolved=a, inputs={"a.run": "d" * 64}) == digest(resolved=b, inputs={"a.run": "d" * 64})
    assert digest(resolved=a, inputs={"a.run": "d" * 64}) != digest(resolved=a, inputs={"a.run": "e" * 64})


def test_buildroot_key_follows_the_package_list():
    recipe = buildroot.recipe_for(targets.get("debian-12"))
    assert replace(recipe, packages=recipe.packages + ("bc",)).key != recipe.key
    assert replace(recipe, packages=tuple(reversed(recipe.packages))).key == recipe.key


@pytest.mark.parametrize("os_name", ["debian-12", "debian-13"])
def test_images_package_list_matches_the_recipe(os_name):
    listed = Path(__file__).resolve().parents[3] / "images" / os_name / "packages.list"
    names = [ln.split("#")[0].strip() for ln in listed.read_text().splitlines()]
    assert tuple(n for n in names if n) == buildroot.recipe_for(targets.get(os_name)).packages


def test_mmdebstrap_argv():
    argv = buildroot.mmdebstrap_argv(
        buildroot.recipe_for(targets.get("debian-12")), Path("/x/root"), "http://m/debian", "http://m/debian-security"
    )
    assert argv[:4] == ["mmdebstrap", "--variant=minbase", "--mode=root", "--format=directory"]
    assert "--include=gcc-12,make,libc6-dev,binutils,libelf1,libssl3,kmod" in argv
    assert argv[-4:] == [
        "/x/root",
        "deb http://m/debian bookworm main",
        "deb http://m/debian bookworm-updates main",
        "deb http://m/debian-security bookworm-security main",
    ]


def test_tree_digest(tmp_path):
    t = tmp_path / "t"
    (t / "nvidia").mkdir(parents=True)
    (t / "nvidia" / "nv.c").write_text("int a;\n")
    (t / "conftest.sh").write_text("#!/bin/sh\n")
    first = tree_digest(t)
    os.utime(t / "nvidia" / "nv.c", (0, 0))
    assert tree_digest(t) == first  # mtimes do not matter
    (t / "conftest.sh").chmod(0o755)
    second = tree_digest(t)
    assert second != first
    (t / "nvidia" / "nv.c").write_text("int b;\n")
    assert tree_digest(t) != second


def test_compile_progress_counts_cc_lines(tmp_path):
    for d in ("nvidia", "nvidia-uvm"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "a.c").write_text("")
    (tmp_path / "nvidia" / "b.c").write_text("")
    seen = []
    progress = kbuild.CompileProgress(kbuild.count_objects(tmp_path), lambda d, t: seen.append((d, t)))
    assert progress.total == 3 + 2
    for line in [
        "  CC [M]  /build/kernel/nvidia/a.o",
        "  LD [M]  /build/kernel/nvidia.o",
        "  CC [M]  /build/kernel/nvidia/b.o",
        "warning: CC [M] inside text",
        "  CC [M]  x",
        "  CC [M]  y",
        "  CC [M]  z",
        "  CC [M]  overflow",
    ]:
        progress(line)
    assert seen[0] == (1, 5) and seen[-1] == (5, 5) and len(seen) == 6


def test_make_argv_uses_fixed_build_dir():
    assert kbuild.make_argv("6.1.0-56-amd64", 4) == [
        "make",
        "-C",
        "/build/kernel",
        "-j4",
        "modules",
        "KERNEL_UNAME=6.1.0-56-amd64",
    ]


def test_sweep_removes_only_dirs_of_dead_processes(tmp_path):
    import subprocess  # noqa: PLC0415 - a real, finished process id

    proc = subprocess.Popen(["true"])  # noqa: S603,S607
    proc.wait()
    mine = buildroot.private_dir(tmp_path, "build")
    (tmp_path / f"build.{proc.pid}.abc").mkdir()
    (tmp_path / f"pack.{proc.pid}.x" / "payload").mkdir(parents=True)
    (tmp_path / "build.1.init").mkdir()  # pid 1 is alive
    (tmp_path / "unrelated").mkdir()
    (tmp_path / f"build.{proc.pid}.young").mkdir()  # no lock file yet and just made: left alone
    old = time.time() - 2 * buildroot.YOUNG_S
    for name in (f"build.{proc.pid}.abc", f"pack.{proc.pid}.x", "build.1.init"):
        os.utime(tmp_path / name, (old, old))
    removed = buildroot.sweep_stale(tmp_path)
    assert sorted(p.name for p in removed) == [f"build.{proc.pid}.abc", f"pack.{proc.pid}.x"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["build.1.init", "unrelated", mine.name, f"build.{proc.pid}.young"])
    assert (mine / buildroot.IN_USE).is_file()
    buildroot.remove_tree(mine)
    assert not mine.exists()


def test_sweep_keeps_a_dir_whose_owner_holds_its_lock_in_another_pid_namespace(tmp_path):
    """A build in a container or an unshared PID namespace shares the cache but not our PIDs: the
    PID in its directory's name means nothing here, its flock on `.in-use` does."""
    import subprocess  # noqa: PLC0415

    unseen = tmp_path / "build.999999999.other-ns"  # a PID that does not exist in this namespace
    unseen.mkdir()
    lock = unseen / buildroot.IN_USE
    lock.touch()
    holder = subprocess.Popen(  # noqa: S603 - holds the lock like the owning build
        ["flock", "-o", lock, "sleep", "30"], start_new_session=True)
    def held() -> bool:
        return subprocess.run(["flock", "-n", lock, "true"]).returncode != 0  # noqa: S603,S607

    def until(want: bool) -> None:  # a loaded machine can take seconds to start or reap a process
        deadline = time.monotonic() + 60
        while held() != want:
            assert time.monotonic() < deadline, f"the lock is {'not ' if want else ''}held after 60 s"
            time.sleep(0.05)

    try:
        until(True)
        assert buildroot.sweep_stale(tmp_path) == [] and unseen.is_dir()
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    until(False)
    assert buildroot.sweep_stale(tmp_path) == [unseen] and not unseen.exists()


def test_published_user_space_is_reused_only_when_made_the_current_way() -> None:
    """A store's user-space artifact made with another layout (or compression) is not reused by
    name: its input digest, recomputed from its own inputs with today's parameters, differs."""
    from nodeprep.artifact import Manifest, input_digest
    from nodeprep.builder import userspace

    inputs = {"libcuda1_535.309.01-1_amd64.deb": "ab" * 32}
    params = userspace.digest_params("535.309.01", "amd64")

    def made_with(p: dict[str, object]) -> Manifest:
        return Manifest(kind="userspace", driver_version="535.309.01", arch="amd64", os="debian-12",
                        input_digest=input_digest(inputs, p), inputs=inputs)

    assert userspace.is_current(made_with(params))
    assert not userspace.is_current(made_with({**params, "layout": userspace.LAYOUT - 1}))


@pytest.mark.parametrize(("os_name", "root_key", "pinned"), [
    ("debian-12", "e7874b025d303056", "7ac003297d2ac2be5e991c4c5fbe17a92cb6c8b1fa9dfe0b59f3d5a5036e9eea"),
    ("debian-13", "450d5320976e00c2", "b8a27454ba049cc6d64bc899030587d515f7ba7865b6a599224f8e9fd2ee0dbb"),
])
def test_a_request_carries_its_resolved_os_and_the_digest_stays_the_same(os_name, root_key, pinned):
    """The request holds the TargetOS itself (resolved once, from --os); the parameters still record
    its name, so build roots and input digests are what they were when the request held the name
    (digests computed by the code before issue 29 moved the TargetOS into the request)."""
    target = targets.get(os_name)
    build_root = replace(BUILD_ROOT, recipe=buildroot.recipe_for(target))
    req = BuildRequest(target=target)
    assert req.target is target and build_params(req, RESOLVED, build_root)["os"] == os_name
    assert build_root.recipe.key == root_key
    assert digest(req=req, build_root=build_root) == pinned
