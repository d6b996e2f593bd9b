"""Bad input to the build commands: one line, exit 2, nothing written; `artifacts list|verify`
on a real store written by nodeprep.artifact; container argv for --builder podman|docker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nodeprep import runner
from nodeprep.artifact import LocalStore
from nodeprep.builder import containerbuild
from nodeprep.builder.resolve import BuildRequest
from tests.support.clirunner import invoke
from tests.support.httpdir import serve_directory
from tests.support.standin import standin_store, tree

from .kmodstore import publish_kmod

OPEN_URL = "http://127.0.0.1:9/open-gpu-kernel-modules-580.142.tar.gz"


def one_error_line(res) -> str:
    lines = res.stderr.strip().splitlines()
    assert lines and lines[0].startswith("error: "), res.output
    assert "Traceback" not in res.output
    return lines[0]


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--os", "debian-99"],
            "error: --os: unknown OS 'debian-99' "
            "(known: debian-12, debian-13, rhel-9, ubuntu-22.04, ubuntu-24.04)",
        ),
        (
            ["--os", "rhel-9"],
            "error: --os: rhel-9 has no chroot build root (its builder is host; chroot build roots: "
            "debian-12, debian-13); use --builder host or podman/docker",
        ),
        (
            ["--os", "debian-12", "--kernel", "6.12.48+deb13-amd64"],
            "error: --kernel: '6.12.48+deb13-amd64' is not a kernel release of debian-12 "
            "(main: 6.1 (bookworm), "
            "named 6.1.0-NN-amd64 like /6\\.1\\.0-\\d+-[a-z0-9-]+/; backports: 6.12 (bookworm-backports), "
            "named 6.12.NN+deb12-amd64 like /\\d+\\.\\d+\\.\\d+\\+deb12-[a-z0-9-]+/)",
        ),
        (
            ["--driver", "latest"],
            "error: --driver: 'latest' is not a driver version (like 535.309.01) or branch (535)",
        ),
        (  # `$` alone matches before a trailing newline: the patterns are applied with fullmatch
            ["--driver", "535.309.01\n"],
            "error: --driver: '535.309.01\\n' is not a driver version (like 535.309.01) or branch (535)",
        ),
        (
            ["--os", "debian-12", "--kernel", "6.1.0-28-amd64\n"],
            "error: --kernel: '6.1.0-28-amd64\\n' is not a kernel release of debian-12 "
            "(main: 6.1 (bookworm), "
            "named 6.1.0-NN-amd64 like /6\\.1\\.0-\\d+-[a-z0-9-]+/; backports: 6.12 (bookworm-backports), "
            "named 6.12.NN+deb12-amd64 like /\\d+\\.\\d+\\.\\d+\\+deb12-[a-z0-9-]+/)",
        ),
        (["--sha256", "ab" * 32], "error: --sha256 is only used with --runfile"),
        (
            ["--runfile", "http://127.0.0.1:9/x.run"],
            "error: --runfile needs --sha256 (the installer's published sha256)",
        ),
        (
            ["--runfile", "http://127.0.0.1:9/x.run", "--sha256", "xyz"],
            "error: --sha256: 'xyz' is not a sha256 hex digest (64 hex digits)",
        ),
        (["--sign-key", "/nonexistent/key.pem"], "error: --sign-key and --sign-cert go together"),
        (["--open-source-sha256", "ab" * 32], "error: --open-source-sha256 is only used with --open-source"),
        (
            ["--open-source", OPEN_URL],
            "error: --open-source needs --open-source-sha256 (the release tarball's sha256)",
        ),
        (
            ["--open-source", OPEN_URL, "--open-source-sha256", "xyz"],
            "error: --open-source-sha256: 'xyz' is not a sha256 hex digest (64 hex digits)",
        ),
        (
            ["--open-source", OPEN_URL, "--open-source-sha256", "ab" * 32, "--flavour", "proprietary"],
            "error: --open-source: a release of NVIDIA's open kernel modules builds the open flavour, "
            "not proprietary (--flavour open)",
        ),
        (  # the names carry the versions: refused before anything is downloaded (port 9 answers nothing)
            ["--open-source", OPEN_URL, "--open-source-sha256", "ab" * 32,
             "--runfile", "http://127.0.0.1:9/NVIDIA-Linux-x86_64-595.45.04.run", "--sha256", "cd" * 32],
            "error: --runfile: NVIDIA-Linux-x86_64-595.45.04.run is driver 595.45.04, but the open-source "
            "release open-gpu-kernel-modules-580.142.tar.gz is 580.142: the kernel modules and the user "
            "space must be the same version",
        ),
    ],
)
def test_bad_build_driver_input(tmp_path, args, message):
    store, cache = tmp_path / "store", tmp_path / "cache"
    res = invoke("build-driver", "--store", str(store), "--cache", str(cache), "--no-smoke-test", *args)
    assert res.exit_code == 2, res.output
    assert one_error_line(res) == message
    assert not store.exists()  # nothing written


def test_bad_flavour_is_a_usage_error(tmp_path):
    res = invoke("build-driver", "--flavour", "closed", "--store", str(tmp_path / "s"))
    assert res.exit_code == 2 and "'closed' is not one of 'proprietary', 'open'" in res.stderr


def test_missing_signing_files(tmp_path):
    key = tmp_path / "key.pem"
    key.write_text("k")
    res = invoke(
        "build-driver",
        "--store",
        str(tmp_path / "s"),
        "--cache",
        str(tmp_path / "c"),
        "--no-smoke-test",
        "--sign-key",
        str(key),
        "--sign-cert",
        str(tmp_path / "cert.pem"),
    )
    assert res.exit_code == 2
    assert one_error_line(res) == f"error: --sign-cert: {tmp_path / 'cert.pem'} does not exist"


def test_podman_missing_is_one_clear_line(tmp_path):
    if runner.which("podman"):
        pytest.skip("podman is installed here")
    res = invoke(
        "build-driver", "--builder", "podman", "--store", str(tmp_path / "s"), "--cache", str(tmp_path)
    )
    assert res.exit_code == 2
    assert one_error_line(res) == (
        "error: --builder podman: podman is not installed (use --builder chroot, or install podman)"
    )


def test_docker_without_engine_is_one_clear_line(tmp_path):
    if not runner.which("docker"):
        res = invoke("build-driver", "--builder", "docker", "--store", str(tmp_path / "s"))
        assert res.exit_code == 2 and "docker is not installed" in one_error_line(res)
        return
    if runner.run(["docker", "info"], check=False, timeout=30).returncode == 0:
        pytest.skip("a docker engine answers here")
    res = invoke("build-driver", "--builder", "docker", "--store", str(tmp_path / "s"))
    assert res.exit_code == 2
    assert one_error_line(res).startswith("error: --builder docker: the docker engine is not usable")


def test_container_argv(tmp_path):
    run = tmp_path / "NVIDIA-Linux-x86_64-535.309.01.run"
    req = BuildRequest(
        driver="535",
        kernel="6.1.0-56-amd64",
        store=tmp_path / "store",
        cache=tmp_path / "cache",
        runfile=str(run),
        runfile_sha256="ab" * 32,
        jobs=4,
        sign_key=tmp_path / "k.pem",
        sign_cert=tmp_path / "c.pem",
        smoke_test=False,
        userspace=False,
    )
    cb = containerbuild.for_request("podman", req, as_json=True)
    assert cb.containerfile.is_file()
    assert containerbuild.build_image_argv(cb) == [
        "podman",
        "build",
        "-t",
        "nodeprep-builder:debian-12",
        "-f",
        str(cb.containerfile),
        str(cb.containerfile.parent),
    ]
    argv = containerbuild.run_argv(cb)
    assert argv[:4] == ["podman", "run", "--rm", "--privileged"]
    assert (
        f"{(tmp_path / 'store').resolve()}:/store" in argv
        and f"{(tmp_path / 'cache').resolve()}:/cache" in argv
    )
    assert f"{run.resolve()}:/inputs/runfile/{run.name}:ro" in argv
    assert f"{(tmp_path / 'k.pem').resolve()}:/inputs/key/k.pem:ro" in argv
    i = argv.index("nodeprep-builder:debian-12")
    assert argv[i + 1 :] == [
        "python3",
        "-m",
        "nodeprep.cli",
        "build-driver",
        "--builder",
        "chroot",
        "--store",
        "/store",
        "--cache",
        "/cache",
        "--os",
        "debian-12",
        "--flavour",
        "proprietary",
        "--arch",
        "amd64",
        "--driver",
        "535",
        "--kernel",
        "6.1.0-56-amd64",
        "--runfile",
        f"/inputs/runfile/{run.name}",
        "--sha256",
        "ab" * 32,
        "--jobs",
        "4",
        "--no-userspace",
        "--json",
        "--sign-key",
        "/inputs/key/k.pem",
        "--sign-cert",
        "/inputs/cert/c.pem",
        "--sign-hash",
        "sha256",
        "--no-smoke-test",
    ]
    # Every option the container gets is one build-driver accepts.
    from nodeprep.commands.build import build_driver_cmd

    known = {o for p in build_driver_cmd.params for o in (*p.opts, *p.secondary_opts)}
    assert {a for a in argv[i + 4 :] if a.startswith("--")} <= known


def _store(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    publish_kmod(store, tmp_path)
    return store


def test_artifacts_list_and_verify(tmp_path):
    store = _store(tmp_path)
    res = invoke("artifacts", "list", str(store), "--json")
    assert res.exit_code == 0
    [entry] = json.loads(res.stdout)
    assert entry["name"] == "nvidia-kmod-535.309.01-proprietary-6.1.0-56-amd64.tar.zst"
    res = invoke("artifacts", "verify", str(store))
    assert res.exit_code == 0 and res.stdout == ""


def test_verify_catches_a_flipped_byte_and_strays(tmp_path):
    store = _store(tmp_path)
    f = store / "nvidia-kmod-535.309.01-proprietary-6.1.0-56-amd64.tar.zst"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01
    f.write_bytes(bytes(data))
    (store / "nvidia-kmod-1.tar.zst").write_bytes(b"stray")
    res = invoke("artifacts", "verify", str(store))
    assert res.exit_code == 1
    lines = res.stdout.strip().splitlines()
    assert lines[0].startswith(f"{f.name}: sha256 ") and "does not match index.json" in lines[0]
    assert lines[-1] == "nvidia-kmod-1.tar.zst: not listed in index.json"


def test_verify_missing_store(tmp_path):
    res = invoke("artifacts", "verify", str(tmp_path / "nope"))
    assert (
        res.exit_code == 2
        and one_error_line(res) == f"error: {tmp_path / 'nope'}: store directory does not exist"
    )


def test_artifacts_list_over_http(tmp_path):
    """A store served over HTTP (a loopback server this test starts) lists like a directory."""
    store = _store(tmp_path)
    with serve_directory(store) as base:
        url = base + "/"
        res = invoke("artifacts", "list", url)
        assert res.exit_code == 0, res.output
        assert res.stdout.startswith(
            "nvidia-kmod-535.309.01-proprietary-6.1.0-56-amd64.tar.zst  kmod 535.309.01 "
        )
        res = invoke("artifacts", "list", url + "missing/")
        assert res.exit_code == 2 and "not found (HTTP 404)" in one_error_line(res)


def test_container_engine_env_and_registry_staging(tmp_path):
    """The engine gets only its own configuration variables (never a registry credentials path),
    and a registry build's container gets a fresh directory store under the cache as /store."""
    env = {"CONTAINERS_CONF": "/etc/c.conf", "DOCKER_HOST": "unix:///run/d.sock", "PATH": "/usr/bin",
           "NODEPREP_REGISTRY_AUTH": str(tmp_path / "config.json"), "HTTPS_PROXY": "http://p:3128"}
    assert containerbuild.engine_env(env) == {"CONTAINERS_CONF": "/etc/c.conf",
                                         "DOCKER_HOST": "unix:///run/d.sock"}
    first, second = containerbuild.staging_store(tmp_path), containerbuild.staging_store(tmp_path)
    assert first != second and first.parent == second.parent == tmp_path / "oci-publish"
    assert not list(first.iterdir())
    cb = containerbuild.for_request("podman", BuildRequest(store=first, cache=tmp_path))
    argv = containerbuild.run_argv(cb)
    assert f"{first.resolve()}:/store" in argv and not any("oci://" in a for a in argv)


def test_container_argv_mounts_an_open_source_release(tmp_path):
    release = tmp_path / "open-gpu-kernel-modules-580.142.tar.gz"
    req = BuildRequest(flavour="open", kernel="6.1.0-56-amd64", store=tmp_path / "store",
                       cache=tmp_path / "c", open_source=str(release), open_source_sha256="ab" * 32,
                       smoke_test=False)
    argv = containerbuild.run_argv(containerbuild.for_request("podman", req))
    assert f"{release.resolve()}:/inputs/open-source/{release.name}:ro" in argv
    i = argv.index("--open-source")
    assert argv[i : i + 4] == ["--open-source", f"/inputs/open-source/{release.name}", "--open-source-sha256",
                               "ab" * 32]


def test_release_and_runfile_of_different_versions_are_refused_before_apt(tmp_path, monkeypatch):
    """Names without versions: the files' own versions (the release's top directory and version.mk,
    the installer's label) are compared once both are fetched, before apt or a build root (the
    mirror is a closed loopback port: reaching it would be another error)."""
    import hashlib

    from tests.support.makeself import make_runfile
    from tests.support.tarballs import write_tgz
    from tests.unit.sources.test_opensource import release_members

    monkeypatch.setenv("NODEPREP_DEBIAN_MIRROR", "http://127.0.0.1:9/debian")
    release = write_tgz(tmp_path / "release.tar.gz", release_members())
    tree = tmp_path / "installer"
    (tree / "kernel-open").mkdir(parents=True)
    run = make_runfile(tree, tmp_path / "driver.run",
                       label="NVIDIA Accelerated Graphics Driver for Linux-x86_64 595.45.04")
    store, cache = tmp_path / "store", tmp_path / "cache"

    def sha(p):
        return hashlib.sha256(p.read_bytes()).hexdigest()

    res = invoke("build-driver", "--store", str(store), "--cache", str(cache), "--no-smoke-test",
                 "--open-source", str(release), "--open-source-sha256", sha(release),
                 "--runfile", str(run), "--sha256", sha(run))
    assert res.exit_code == 2, res.output
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error: ")]
    assert "Traceback" not in res.output and res.stderr.strip().splitlines()[-1] == errors[0]
    assert errors == [
        "error: --runfile: driver.run is driver 595.45.04, but the open-source release release.tar.gz is "
        "580.142: the kernel modules and the user space must be the same version"]
    assert not store.exists()
    assert not (cache / "apt").exists() and not (cache / "buildroots").exists()


def test_artifacts_push_check_lists_what_it_would_push_and_contacts_nothing(tmp_path: Path) -> None:
    store = standin_store(tmp_path / "work", tmp_path / "store", "535.309.01")
    names = sorted(e.name for e in LocalStore(store).entries())
    before = tree(tmp_path)
    # port 9 on loopback: nothing listens, so a push (or any registry contact) would fail
    res = invoke("artifacts", "push", str(store), "oci://127.0.0.1:9/drivers", "--check")
    assert res.exit_code == 0, res.output
    assert tree(tmp_path) == before
    lines = res.stdout.splitlines()
    assert [ln.split()[2] for ln in lines[:-1]] == names
    assert all(ln.endswith(" to oci://127.0.0.1:9/drivers") for ln in lines[:-1])
    assert lines[-1] == f"would merge {len(names)} artifacts into the index of oci://127.0.0.1:9/drivers"
    res = invoke("artifacts", "push", str(store), "oci://127.0.0.1:9/drivers", "--check", "--json",
                 "--name", names[0], "--name", "nodeprep-missing.tar.zst")
    assert json.loads(res.stdout) == {"check": True, "registry": "oci://127.0.0.1:9/drivers",
                                      "would_push": [names[0]], "not_in_source": ["nodeprep-missing.tar.zst"]}


@pytest.fixture
def recorded_debian12(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Debian archive answers from tests/fixtures/debian-archive (no apt, no network): the
    stand-in replaces nodeprep.sources.debian.DebianArchive, the archive boundary, nothing above it."""
    from nodeprep.sources import debian
    from tests.support.recordedarchive import recorded

    monkeypatch.setattr(debian, "DebianArchive", lambda *a, **k: recorded("debian12-archive.json"))


def test_build_driver_check_prints_the_plan_and_changes_nothing(tmp_path: Path,
                                                                recorded_debian12: None) -> None:
    """build-driver --check: the resolved inputs (driver source and headers packages with their
    versions) and the artifact's name; the cache and the store are byte for byte as they were
    (no download, no build root, no plan memo, nothing published)."""
    cache, store = tmp_path / "cache", tmp_path / "store"
    (cache / "debs").mkdir(parents=True)
    publish_kmod(store, tmp_path / "work")
    before = tree(tmp_path)
    res = invoke("build-driver", "--check", "--json", "--cache", str(cache), "--store", str(store),
                 "--kernel", "6.1.0-50-amd64", "--driver", "535")
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    assert plan["artifact"] == "nvidia-kmod-535.309.01-proprietary-6.1.0-50-amd64.tar.zst"
    assert plan["would_fetch"] == ["nvidia-kernel-source=535.309.01-0+deb12u1",
                                   "linux-headers-6.1.0-50-amd64=6.1.176-1",
                                   "linux-headers-6.1.0-50-common=6.1.176-1", "linux-kbuild-6.1=6.1.176-1"]
    assert plan["in_store"] is False and plan["build_root"]["cached"] is False
    res = invoke("build-driver", "--check", "--cache", str(cache), "--store", str(store))
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("would build nvidia-kmod-535.309.01-proprietary-6.1.0-56-amd64.tar.zst "
                                 "(driver 535.309.01, kernel 6.1.0-56-amd64, debian-12, builder chroot)\n")
    assert f"  store {store}: there" in res.stdout  # the kmod publish_kmod put there
    # a runfile is named, not fetched (port 9 answers nothing): its version comes from its name
    run = "http://127.0.0.1:9/NVIDIA-Linux-x86_64-550.163.01.run"
    res = invoke("build-driver", "--check", "--json", "--cache", str(cache), "--store", str(store),
                 "--runfile", run, "--sha256", "ab" * 32)
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    assert plan["artifact"] == "nvidia-kmod-550.163.01-proprietary-6.1.0-56-amd64.tar.zst"
    assert plan["would_fetch"][0] == f"{run} (sha256 {'ab' * 32})"
    assert tree(tmp_path) == before


def test_build_driver_check_never_fetches_the_package_lists(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """With the real archive and no package lists in the cache, --check fetches none (the mirror is
    a closed loopback port): one error line saying so, and the cache is as it was (no apt folder,
    no sources list, no lock)."""
    monkeypatch.setenv("NODEPREP_DEBIAN_MIRROR", "http://127.0.0.1:9/debian")
    cache = tmp_path / "cache"
    cache.mkdir()
    res = invoke("build-driver", "--check", "--cache", str(cache), "--store", str(tmp_path / "store"))
    assert res.exit_code == 1, res.output
    assert one_error_line(res).startswith("error: the Debian bookworm package lists are not in the cache")
    assert tree(tmp_path) == {"cache": "dir"}


def test_smoke_test_check_names_the_kernel_and_boots_nothing(tmp_path: Path) -> None:
    """smoke-test --check: the kernel it would boot (the artifact's, or --kernel with --force) and
    the packages it would fetch for it, from the manifest; the cache stays as it was (nothing
    fetched, extracted or booted); another kernel without --force is refused as a real run is."""
    kmod = publish_kmod(tmp_path / "store", tmp_path / "work")
    cache = tmp_path / "cache"
    cache.mkdir()
    before = tree(tmp_path)
    res = invoke("smoke-test", str(kmod), "--check", "--cache", str(cache))
    assert res.exit_code == 0, res.output
    assert res.stdout == ("would boot kernel 6.1.0-56-amd64 (debian-12) in qemu with nvidia.ko of "
                          f"{kmod.name}\n"
                          "  would fetch: linux-image-6.1.0-56-amd64, linux-headers-6.1.0-56-amd64\n")
    res = invoke("smoke-test", str(kmod), "--check", "--json", "--cache", str(cache), "--kernel",
                 "6.1.0-50-amd64", "--force", "--sig-enforce")
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    assert (plan["kernel_release"], plan["built_for"], plan["sig_enforce"]) == ("6.1.0-50-amd64",
                                                                              "6.1.0-56-amd64", True)
    res = invoke("smoke-test", str(kmod), "--check", "--cache", str(cache), "--kernel", "6.1.0-50-amd64")
    assert res.exit_code == 2 and one_error_line(res).endswith("(add --force to boot it there anyway)")
    assert tree(tmp_path) == before
