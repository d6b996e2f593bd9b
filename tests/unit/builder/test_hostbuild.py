"""`--builder host`: where the headers are found, what identifies them, which compiler runs, and
the container runs of non-Debian OSes (per-kernel image, `--builder host` inside).

Headers trees here are small directories holding the real identifying lines of Debian's, Ubuntu's
and RHEL's headers (CONFIG_CC_VERSION_TEXT, UTS_RELEASE); the real trees are built against in
tests/slow/builder/test_host_build.py."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from nodeprep import targets
from nodeprep.builder import cc, containerbuild, hostbuild
from nodeprep.builder.resolve import BuildRequest
from nodeprep.errors import InputError
from tests.support.clirunner import invoke

DEBIAN_CC = "gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0"
UBUNTU_CC = "x86_64-linux-gnu-gcc-13 (Ubuntu 13.2.0-23ubuntu4) 13.2.0"
RHEL_CC = "gcc (GCC) 11.4.1 20231218 (Red Hat 11.4.1-3)"


def headers_tree(d: Path, release: str, cc_text: str = DEBIAN_CC, makefile: str = "") -> Path:
    (d / "include" / "generated").mkdir(parents=True)
    (d / ".config").write_text(f'CONFIG_CC_VERSION_TEXT="{cc_text}"\nCONFIG_CC_IS_GCC=y\n')
    (d / "Makefile").write_text(makefile or "# kernel Makefile\n")
    (d / "Module.symvers").write_text("0x12345678\tprintk\tvmlinux\tEXPORT_SYMBOL\t\n")
    (d / "include" / "generated" / "utsrelease.h").write_text(f'#define UTS_RELEASE "{release}"\n')
    return d


# ---------------------------------------------------------------------------------------------
# Discovery


def test_discovery_order(tmp_path):
    rel = "6.8.0-45-generic"
    lm = tmp_path / "lib" / "modules" / rel / "build"
    deb = tmp_path / "usr" / "src" / f"linux-headers-{rel}"
    rhel = tmp_path / "usr" / "src" / "kernels" / rel
    assert hostbuild.header_candidates(rel, tmp_path) == [lm, deb, rhel]
    for d in (lm, deb, rhel):
        headers_tree(d, rel)
    assert hostbuild.find_headers_dir(rel, root=tmp_path) == lm
    (lm / ".config").unlink()  # an incomplete tree is skipped
    assert hostbuild.find_headers_dir(rel, root=tmp_path) == deb
    (deb / "Makefile").unlink()
    assert hostbuild.find_headers_dir(rel, root=tmp_path) == rhel
    explicit = headers_tree(tmp_path / "elsewhere", rel)
    assert hostbuild.find_headers_dir(rel, explicit, root=tmp_path) == explicit  # --headers-dir first


def test_discovery_errors_name_what_was_tried(tmp_path):
    with pytest.raises(InputError) as e:
        hostbuild.find_headers_dir("5.14.0-427.13.1.el9_4.x86_64", root=tmp_path)
    assert str(e.value).startswith(
        "--kernel: no headers for 5.14.0-427.13.1.el9_4.x86_64 on this system (tried "
    )
    assert f"{tmp_path}/usr/src/kernels/5.14.0-427.13.1.el9_4.x86_64" in str(e.value)
    with pytest.raises(InputError, match=r"^--headers-dir: .* is not a kernel headers tree"):
        hostbuild.find_headers_dir(None, tmp_path)
    with pytest.raises(InputError, match="give --kernel RELEASE or --headers-dir DIR"):
        hostbuild.find_headers_dir(None, None)


def test_release_comes_from_utsrelease_and_must_match_kernel(tmp_path):
    d = headers_tree(tmp_path / "h", "6.1.0-56-amd64")
    assert hostbuild.headers_release(d) == "6.1.0-56-amd64"
    build_root, release = hostbuild.host_root(targets.get("debian-12"), None, d)
    assert release == "6.1.0-56-amd64" and build_root.recipe.key == "host"
    with pytest.raises(InputError, match="holds the headers of 6.1.0-56-amd64, not --kernel 6.1.0-47-amd64"):
        hostbuild.host_root(targets.get("debian-12"), "6.1.0-47-amd64", d)


def test_source_dir_follows_debians_split_headers(tmp_path):
    common = headers_tree(tmp_path / "usr/src/linux-headers-6.1.0-56-common", "x")
    arch = headers_tree(
        tmp_path / "usr/src/linux-headers-6.1.0-56-amd64",
        "6.1.0-56-amd64",
        makefile=f"include {common}/Makefile\n",
    )
    assert hostbuild.source_dir(arch) == common
    lm = tmp_path / "lib/modules/6.1.0-56-amd64"
    lm.mkdir(parents=True)
    (lm / "build").symlink_to(arch)
    (lm / "source").symlink_to(common)
    assert hostbuild.source_dir(lm / "build") == lm / "source"
    rhel = headers_tree(tmp_path / "usr/src/kernels/5.14.0-427.el9.x86_64", "5.14.0-427.el9.x86_64")
    assert hostbuild.source_dir(rhel) == rhel  # one tree


# ---------------------------------------------------------------------------------------------
# Headers digest


def test_headers_digest_covers_config_symvers_utsrelease_and_compiler(tmp_path):
    a = headers_tree(tmp_path / "a", "6.1.0-56-amd64")
    b = headers_tree(tmp_path / "b", "6.1.0-56-amd64")
    base = hostbuild.headers_digest(a, DEBIAN_CC)
    assert hostbuild.headers_digest(b, DEBIAN_CC) == base  # the path is not an input
    assert hostbuild.headers_digest(a, "gcc-12 (Debian 12.2.0-14) 12.2.0") != base
    for name in hostbuild.DIGEST_FILES:
        c = headers_tree(tmp_path / f"c{len(name)}{name.count('/')}", "6.1.0-56-amd64")
        with open(c / name, "a") as f:
            f.write("\n")
        assert hostbuild.headers_digest(c, DEBIAN_CC) != base, name
    (a / "include" / "linux").mkdir()
    (a / "include" / "linux" / "other.h").write_text("/* not identifying */\n")
    assert hostbuild.headers_digest(a, DEBIAN_CC) == base


# ---------------------------------------------------------------------------------------------
# Compiler selection


@pytest.mark.parametrize(
    "kernel_cc, installed, env, expected",
    [
        (DEBIAN_CC, {"gcc-12", "gcc"}, {}, "gcc-12"),
        (UBUNTU_CC, {"x86_64-linux-gnu-gcc-13", "gcc-13", "gcc"}, {}, "x86_64-linux-gnu-gcc-13"),
        (UBUNTU_CC, {"gcc-13", "gcc"}, {}, "gcc-13"),
        (UBUNTU_CC, {"gcc-13", "gcc", "/opt/cc/bin/gcc13"}, {"CC": "/opt/cc/bin/gcc13"}, "/opt/cc/bin/gcc13"),
        (RHEL_CC, {"gcc"}, {}, "gcc"),
        (DEBIAN_CC, {"gcc"}, {}, "gcc"),  # then checked, and refused when the version differs
        (DEBIAN_CC, set(), {}, "gcc-12"),  # nothing installed: reported as missing by the check
    ],
)
def test_select_compiler(kernel_cc, installed, env, expected):
    which = lambda p: f"/usr/bin/{p}" if p in installed else None  # noqa: E731
    assert hostbuild.select_compiler(cc.Compiler(kernel_cc), which=which, environ=env) == expected


def test_this_systems_gcc_passes_the_chroot_builders_check(tmp_path):
    """On this Debian 12 machine the kernel's gcc-12 is installed: host_root picks and checks it."""
    d = headers_tree(tmp_path / "h", "6.1.0-56-amd64")
    build_root, _ = hostbuild.host_root(targets.get("debian-12"), "6.1.0-56-amd64", d)
    assert build_root.program == "gcc-12"
    assert cc.mismatch(cc.read_kernel_compiler(d), cc.Compiler(build_root.compiler)) is None
    other = headers_tree(tmp_path / "o", "6.1.0-56-amd64", cc_text="gcc-11 (Debian 11.3.0-12) 11.3.0")
    if shutil.which("gcc-11") or os.environ.get("CC"):
        pytest.skip("gcc-11 or $CC is available here")
    root11, _ = hostbuild.host_root(targets.get("debian-12"), None, other)
    assert root11.program == "gcc" and root11.compiler.startswith("gcc (Debian 12.")
    problem = cc.mismatch(cc.read_kernel_compiler(other), cc.Compiler(root11.compiler))
    assert problem and "gcc-11 (Debian 11.3.0-12) 11.3.0" in problem  # refused unless --allow-cc-mismatch


def test_make_vars(tmp_path):
    d = headers_tree(tmp_path / "h", "6.1.0-56-amd64")
    build_root, _ = hostbuild.host_root(targets.get("debian-12"), None, d)
    assert hostbuild.make_vars(build_root, tmp_path / "w" / "build" / "kernel") == [
        f"SYSSRC={d}",
        f"SYSOUT={d}",
        "CC=gcc-12",
        f"KCFLAGS=-ffile-prefix-map={tmp_path}/w/build/kernel=/build/kernel",
    ]


# ---------------------------------------------------------------------------------------------
# Containers of other OSes


@pytest.mark.parametrize("os_name", ["ubuntu-22.04", "ubuntu-24.04", "rhel-9"])
def test_container_of_other_os_builds_per_kernel_and_runs_host(tmp_path, os_name):
    req = BuildRequest(
        target=targets.get(os_name),
        kernel="6.8.0-45-generic",
        store=tmp_path / "store",
        cache=tmp_path / "cache",
        runfile="https://example.invalid/NVIDIA-Linux-x86_64-550.127.05.run",
        runfile_sha256="ab" * 32,
        builder="host",
    )
    cb = containerbuild.for_request("docker", req)
    assert cb.containerfile.is_file()
    assert containerbuild.build_image_argv(cb) == [
        "docker",
        "build",
        "--build-arg",
        "KERNEL_RELEASE=6.8.0-45-generic",
        "-t",
        f"nodeprep-builder:{os_name}-6.8.0-45-generic",
        "-f",
        str(cb.containerfile),
        str(cb.containerfile.parent),
    ]
    argv = containerbuild.run_argv(cb)
    i = argv.index(f"nodeprep-builder:{os_name}-6.8.0-45-generic")
    assert argv[i + 1 : i + 6] == ["python3", "-m", "nodeprep.cli", "build-driver", "--builder"]
    assert argv[i + 6] == "host"
    assert argv[argv.index("--os") + 1] == os_name and argv[argv.index("--kernel") + 1] == "6.8.0-45-generic"


def test_debian_container_keeps_chroot_and_one_image(tmp_path):
    cb = containerbuild.for_request("podman", BuildRequest(store=tmp_path / "s", cache=tmp_path / "c"))
    assert cb.image == "nodeprep-builder:debian-12"
    assert "--build-arg" not in containerbuild.build_image_argv(cb)
    argv = containerbuild.run_argv(cb)
    assert argv[argv.index("--builder") + 1] == "chroot"


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--builder", "podman", "--os", "ubuntu-24.04"],
            "error: --builder podman --os ubuntu-24.04: --kernel RELEASE is required "
            "(the image installs that kernel's headers)",
        ),
        (
            ["--builder", "docker", "--os", "rhel-9"],
            "error: --builder docker --os rhel-9: --kernel RELEASE is required "
            "(the image installs that kernel's headers)",
        ),
        (["--headers-dir", "/usr/src"], "error: --headers-dir is only used with --builder host"),
        (
            ["--builder", "host", "--os", "debian-99"],
            "error: --os: unknown OS 'debian-99' "
            "(known: debian-12, debian-13, rhel-9, ubuntu-22.04, ubuntu-24.04)",
        ),
        (
            ["--builder", "podman", "--os", "debian-99"],
            "error: --os: unknown OS 'debian-99' "
            "(known: debian-12, debian-13, rhel-9, ubuntu-22.04, ubuntu-24.04)",
        ),
        (
            ["--builder", "host", "--os", "rhel-9", "--smoke-test"],
            "error: --smoke-test: boots Debian kernels only, not rhel-9 (use --no-smoke-test)",
        ),
        (
            ["--builder", "host", "--os", "ubuntu-24.04", "--kernel", "6.8.0-45-generic"],
            "error: --kernel: no headers for 6.8.0-45-generic on this system (tried "
            "/lib/modules/6.8.0-45-generic/build, /usr/src/linux-headers-6.8.0-45-generic, "
            "/usr/src/kernels/6.8.0-45-generic); install them or pass --headers-dir",
        ),
    ],
)
def test_bad_host_and_container_input(tmp_path, args, message):
    if os.path.exists("/lib/modules/6.8.0-45-generic"):
        pytest.skip("this machine has 6.8.0-45-generic headers")
    store = tmp_path / "store"
    res = invoke("build-driver", "--store", str(store), "--cache", str(tmp_path / "cache"), *args)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert lines[0] == message and "Traceback" not in res.output
    assert not store.exists() or not list(store.iterdir())


def test_debian13_builds_in_debian12s_container(tmp_path):
    """Debian 13 has no image of its own: Debian 12's container makes the trixie build root, and the
    build inside still targets debian-13."""
    req = BuildRequest(store=tmp_path / "s", cache=tmp_path / "c", target=targets.get("debian-13"))
    cb = containerbuild.for_request("podman", req)
    assert cb.containerfile == containerbuild.REPO / "images" / "debian-12" / "Containerfile"
    assert cb.containerfile.is_file()
    assert cb.image == "nodeprep-builder:debian-12"
    argv = containerbuild.run_argv(cb)
    assert argv[argv.index("--builder") + 1] == "chroot" and argv[argv.index("--os") + 1] == "debian-13"
