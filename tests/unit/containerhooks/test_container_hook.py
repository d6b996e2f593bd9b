"""nodeprep's createContainer hook as the runtime runs it: a real process started the way the CDI
spec says (the program /usr/libexec/nodeprep/cdi-hook that nodeprep writes, here under a temporary
root, run with the host's /usr/bin/python3 and `--driver V`), the OCI state JSON on stdin and the
container's config.json in the bundle (written here in the OCI runtime-spec layout). The container
start itself is in tests/slow/join/test_cdi_podman.py and test_cri_containerd.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from nodeprep.containerhooks.container import LIB64, _open_dir, link_dir, mounted_libraries, shadowing_entries
from nodeprep.containerhooks.gate import decide
from nodeprep.containerhooks.jsonload import loads
from nodeprep.runtime import cdi
from nodeprep.runtime.files import apply_changes
from nodeprep.runtime.hookprogram import hook_program

REQUIRE_12_2 = "cuda>=12.2 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471"
REQUIRE_12_4 = "cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=tesla,driver>=535,driver<536"


def installed_hook(tmp_path: Path) -> Path:
    """The hook program as nodeprep writes it on a node (here under tmp_path/node)."""
    changes = hook_program(tmp_path / "node")
    apply_changes(changes)
    program = changes[-1]  # the modules file, then the program that loads it
    return program.path


def run_hook(
    tmp_path: Path, env: list[str], driver: str = "535.309.01", *, extra: list[str] | None = None,
    config: dict | None = None,  # type: ignore[type-arg]
) -> subprocess.CompletedProcess[str]:
    bundle = tmp_path / "bundle"
    bundle.mkdir(exist_ok=True)
    (bundle / "config.json").write_text(
        json.dumps(
            {"ociVersion": "1.0.2", "process": {"args": ["sh"], "env": env}, "root": {"path": "rootfs"},
             **(config or {})}
        )
    )
    state = {"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 1, "bundle": str(bundle)}
    path, argv, hook_env = cdi.hook_command()
    return subprocess.run(
        [*argv, "--driver", driver, *(extra or [])],
        executable=installed_hook(tmp_path),
        input=json.dumps(state),
        capture_output=True,
        text=True,
        env=dict(e.split("=", 1) for e in hook_env),
        timeout=60,
    )


def test_allowed_refused_bypassed(tmp_path: Path) -> None:
    ok = run_hook(tmp_path, ["PATH=/usr/bin", f"NVIDIA_REQUIRE_CUDA={REQUIRE_12_2}"])
    assert ok.returncode == 0 and ok.stderr == ""
    refused = run_hook(tmp_path, [f"NVIDIA_REQUIRE_CUDA={REQUIRE_12_4}"])
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        "nodeprep: container refused: NVIDIA_REQUIRE_CUDA requires CUDA >=12.4, but driver 535.309.01 "
        "supports up to CUDA 12.2 (set NVIDIA_DISABLE_REQUIRE=1 to skip the check)"
    ]
    bypassed = run_hook(tmp_path, [f"NVIDIA_REQUIRE_CUDA={REQUIRE_12_4}", "NVIDIA_DISABLE_REQUIRE=true"])
    assert bypassed.returncode == 0
    assert run_hook(tmp_path, ["PATH=/usr/bin"]).returncode == 0  # no requirement: nothing to check


def test_malformed_requirement_and_bad_state(tmp_path: Path) -> None:
    bad = run_hook(tmp_path, ["NVIDIA_REQUIRE_CUDA=cuda>>12.2"])
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1
    assert "NVIDIA_REQUIRE_CUDA: malformed constraint 'cuda>>12.2'" in bad.stderr
    path, argv, env = cdi.hook_command()
    r = subprocess.run([*argv, "--driver", "535.309.01"], executable=installed_hook(tmp_path),
                       input="not json",
                       capture_output=True, text=True, env=dict(e.split("=", 1) for e in env), timeout=60)
    assert r.returncode == 1 and "cannot read the container's OCI state/config" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    ("env", "refused"),
    [
        ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.2", "NVIDIA_REQUIRE_DRIVER": "driver>=550"}, True),  # ANDed
        ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.2", "NVIDIA_DISABLE_REQUIRE": "1"}, False),
        ({"NVIDIA_REQUIRE_CUDA": ""}, False),
    ],
)
def test_every_require_variable_counts(env: dict[str, str], refused: bool) -> None:
    assert (decide(env, "535.216.03", [], None)[0] is not None) is refused


def real_ld_cache(tmp_path: Path) -> Path:
    """An ld.so.cache written by the real ldconfig (-C/-f: no chroot) for a directory holding a
    real shared object with soname libcuda.so.1, standing for an image's CUDA compat libraries."""
    compat = tmp_path / "compat"
    compat.mkdir()
    (tmp_path / "cuda.c").write_text("int cuInit(unsigned int flags) { return flags ? 1 : 0; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o",
                    compat / "libcuda.so.550.54.15", tmp_path / "cuda.c"], check=True, timeout=120)
    (tmp_path / "ld.so.conf").write_text(f"{compat}\n")
    cache = tmp_path / "ld.so.cache"
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    subprocess.run([ldconfig, "-C", cache, "-f", tmp_path / "ld.so.conf"], check=True, timeout=120)
    return cache


def test_shadowing_entries_of_a_real_ld_cache(tmp_path: Path) -> None:
    raw = real_ld_cache(tmp_path).read_bytes()
    compat = f"{tmp_path}/compat"
    lib = "/usr/lib/x86_64-linux-gnu"
    names = {"libcuda.so.1", "libcuda.so.535.309.01"}
    assert shadowing_entries(raw, names, (lib, LIB64)) == [f"{compat}/libcuda.so.1"]
    assert shadowing_entries(raw, {"libcuda.so.1"}, (compat,)) == []  # the mounted copy is the cached one
    assert shadowing_entries(raw, {"libnvidia-ml.so.1"}, (lib, LIB64)) == []


def test_mounted_libraries_from_the_config() -> None:
    config = {"mounts": [
        {"destination": "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "source": "/opt/nvidia/5/lib64/a.so"},
        {"destination": "/usr/lib64/libcuda.so.1", "source": "/opt/nvidia/5/lib64/a.so"},
        {"destination": "/usr/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.1", "source": "/x"},
        {"destination": "/usr/bin/nvidia-smi", "source": "/opt/nvidia/5/bin/nvidia-smi"},
    ]}
    assert mounted_libraries(config, "/usr/lib/x86_64-linux-gnu") == {"libcuda.so.1"}
    assert mounted_libraries(config, "/usr/lib64/") == {"libcuda.so.1"}
    assert mounted_libraries({}, "/usr/lib64") == set()


@pytest.mark.parametrize("text", [
    '{"bundle": "/run/c/1", "pid": 12, "annotations": {"a": "\\u003e=12 \\"q\\" \\ud83d\\ude00"}}',
    json.dumps({"process": {"env": ["NVIDIA_REQUIRE_CUDA=cuda>=12.2", "X=é"]}, "n": [1.5, -2, None, True]}),
    " [] ", '"x"', "1e3",
])
def test_loads_is_json_loads(text: str) -> None:
    assert loads(text) == json.loads(text)


@pytest.mark.parametrize("text", ["", "{", "{} {}", "{'a': 1}", "nul"])
def test_loads_refuses_what_json_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        loads(text)


@pytest.mark.parametrize("shadowed", [True, False])
def test_hook_rebuilds_the_ld_cache_only_when_it_names_another_copy(tmp_path: Path, shadowed: bool) -> None:
    """The hook process with `--ldconfig`: an image whose cache names its own libcuda.so.1 gets the
    mounted directory written into its ld.so.conf.d (this image has no ldconfig, so it says so and
    the container still starts); an image whose cache does not is left untouched."""
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    cache = real_ld_cache(tmp_path) if shadowed else None
    (rootfs / "etc/ld.so.cache").write_bytes(cache.read_bytes() if cache else b"glibc-ld.so.cache1.1")
    lib = "/usr/lib/x86_64-linux-gnu"
    source = "/opt/nvidia/535.309.01/lib64/libcuda.so.535.309.01"
    mounts = [{"destination": f"{d}/libcuda.so.1", "source": source, "options": ["ro", "rbind"]}
              for d in (lib, LIB64)]
    (rootfs / "proc").mkdir()
    before = (rootfs / "etc/ld.so.cache").read_bytes()
    r = run_hook(tmp_path, ["PATH=/usr/bin"], extra=["--ldconfig", lib],
                 config={"root": {"path": str(rootfs)}, "mounts": mounts})
    assert r.returncode == 0
    conf = rootfs / "etc/ld.so.conf.d/00-nodeprep-nvidia.conf"
    if shadowed:
        assert conf.read_text() == f"{lib}\n"
        assert_rebuilt_by_the_node(rootfs, before, r)
    else:
        assert not conf.exists() and r.stderr == ""
        assert (rootfs / "etc/ld.so.cache").read_bytes() == before


def assert_rebuilt_by_the_node(rootfs: Path, before: bytes, r: subprocess.CompletedProcess[str]) -> None:
    """The image (which has no ldconfig of its own) got a new ld cache, written by the node's
    ldconfig: the old one's entries for copies outside the image are gone."""
    after = (rootfs / "etc/ld.so.cache").read_bytes()
    assert r.stderr == "" and after != before and after.startswith(b"glibc-ld.so.cache")
    assert b"/compat/libcuda.so.1" not in after


def test_hook_follows_no_link_of_the_image(tmp_path: Path) -> None:
    """The hook runs before pivot_root: an image's links would resolve against the node's root. A
    cache that is a link is not read; a link in the ld.so.conf.d path is not written through."""
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    cache = real_ld_cache(tmp_path)
    (rootfs / "etc/ld.so.cache").symlink_to(cache)  # would name a shadowing libcuda.so.1
    lib = "/usr/lib/x86_64-linux-gnu"
    config = {"root": {"path": str(rootfs)},
              "mounts": [{"destination": f"{lib}/libcuda.so.1", "source": "/x", "options": ["rbind"]}]}
    r = run_hook(tmp_path, ["PATH=/usr/bin"], extra=["--ldconfig", lib], config=config)
    assert (r.returncode, r.stderr) == (0, "")
    assert not (rootfs / "etc/ld.so.conf.d").exists()

    (rootfs / "etc/ld.so.cache").unlink()
    (rootfs / "etc/ld.so.cache").write_bytes(cache.read_bytes())
    outside = tmp_path / "node-etc"
    outside.mkdir()
    (rootfs / "etc/ld.so.conf.d").symlink_to(outside)
    r = run_hook(tmp_path, ["PATH=/usr/bin"], extra=["--ldconfig", lib], config=config)
    assert r.returncode == 0 and "a link in the image's /etc/ld.so.conf.d path" in r.stderr
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("cached", [True, False])
def test_hook_rebuilds_the_ld_cache_for_a_new_cuda_compat_folder(tmp_path: Path, cached: bool) -> None:
    """After NVIDIA's enable-cuda-compat wrote /etc/ld.so.conf.d/00-compat-*.conf (the image's CUDA
    compat libraries are newer than the driver), the hook rebuilds a cache that does not name that
    folder yet, and leaves one alone that does."""
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc/ld.so.conf.d").mkdir(parents=True)
    cache = real_ld_cache(tmp_path)  # names tmp_path/compat/libcuda.so.1
    (rootfs / "etc/ld.so.cache").write_bytes(cache.read_bytes())
    folder = tmp_path / "compat" if cached else "/usr/local/cuda/compat"
    (rootfs / "etc/ld.so.conf.d/00-compat-2113748.conf").write_text(f"{folder}\n")
    lib = "/usr/lib/x86_64-linux-gnu"
    (rootfs / "proc").mkdir()
    before = (rootfs / "etc/ld.so.cache").read_bytes()
    r = run_hook(tmp_path, ["PATH=/usr/bin"], extra=["--ldconfig", lib],
                 config={"root": {"path": str(rootfs)}, "mounts": []})
    assert r.returncode == 0
    conf = rootfs / "etc/ld.so.conf.d/00-nodeprep-nvidia.conf"
    if cached:
        assert not conf.exists() and r.stderr == ""
    else:
        assert conf.read_text() == f"{lib}\n"
        assert_rebuilt_by_the_node(rootfs, before, r)


MULTIARCH = "/usr/lib/x86_64-linux-gnu"
FOLDER = "/opt/nvidia/535.309.01/lib64"  # the versioned library folder the spec mounts once
LINKS = ["--link", "libcuda.so.535.309.01", "--link", "libcuda.so.1", "--link", "libcuda.so=libcuda.so.1"]


def image(tmp_path: Path, layout: str) -> Path:
    """A rootfs whose C library lies where its loader searches: the multiarch directory (Debian and
    Ubuntu) or /usr/lib64 (RHEL/UBI; /lib64 a link to it), and its ld.so.cache."""
    rootfs = tmp_path / "rootfs"
    libc = rootfs / ("usr/lib64" if layout == "lib64" else MULTIARCH.lstrip("/")) / "libc.so.6"
    libc.parent.mkdir(parents=True)
    libc.write_bytes(b"\x7fELF")
    (rootfs / "lib64").symlink_to("usr/lib64")
    (rootfs / "etc").mkdir()
    (rootfs / "etc/ld.so.cache").write_bytes(b"glibc-ld.so.cache1.1")
    (rootfs / "proc").mkdir()  # where the runtime has mounted the container's /proc
    return rootfs


def link_hook(tmp_path: Path, rootfs: Path) -> subprocess.CompletedProcess[str]:
    mount = {"destination": FOLDER, "source": FOLDER, "type": "bind", "options": ["ro", "rbind"]}
    args = ["--ldconfig", MULTIARCH, "--libraries", FOLDER, *LINKS]
    return run_hook(tmp_path, ["PATH=/usr/bin"], extra=args,
                    config={"root": {"path": str(rootfs)}, "mounts": [mount]})


def links_in(folder: Path) -> dict[str, str]:
    return {p.name: os.readlink(p) for p in folder.iterdir() if p.is_symlink()} if folder.is_dir() else {}


@pytest.mark.parametrize("layout", ["debian", "lib64"])
def test_hook_links_the_libraries_where_the_image_loader_looks(tmp_path: Path, layout: str) -> None:
    """The hook process with `--libraries`: each name a link to the mounted folder's entry in the
    loader's default directory of the image's layout (a lib64 image's loader does not search the
    multiarch directory: tests/slow/join/test_cdi_podman.py loads through these links), the other
    directory left alone; a second start (the same rootfs) finds its links and changes nothing."""
    rootfs = image(tmp_path, layout)
    want = {"libcuda.so.535.309.01": f"{FOLDER}/libcuda.so.535.309.01",
            "libcuda.so.1": f"{FOLDER}/libcuda.so.1", "libcuda.so": f"{FOLDER}/libcuda.so.1"}
    used, other = (rootfs / "usr/lib64", rootfs / MULTIARCH.lstrip("/"))
    if layout == "debian":
        used, other = other, used
    for _ in range(2):
        r = link_hook(tmp_path, rootfs)
        assert (r.returncode, r.stderr) == (0, "")
        assert links_in(used) == want
        assert links_in(other) == {}
        assert not (rootfs / "etc/ld.so.conf.d").exists()  # no ld cache rebuild: nothing shadows them


def test_hook_replaces_its_links_of_another_version_and_leaves_the_image_files(tmp_path: Path) -> None:
    """After a driver switch a reused rootfs holds links to the earlier version's folder: replaced. A
    file of the image's own under a library's name is left as it is, and counts as shadowing: the
    mounted folder goes first into the image's ld cache (rebuilt by the node's ldconfig)."""
    rootfs = image(tmp_path, "debian")
    lib = rootfs / MULTIARCH.lstrip("/")
    (lib / "libcuda.so.1").symlink_to("/opt/nvidia/530.30.02/lib64/libcuda.so.1")
    r = link_hook(tmp_path, rootfs)
    assert (r.returncode, r.stderr) == (0, "")
    assert os.readlink(lib / "libcuda.so.1") == f"{FOLDER}/libcuda.so.1"

    (lib / "libcuda.so.1").unlink()
    (lib / "libcuda.so.1").write_bytes(b"the image's own")
    r = link_hook(tmp_path, rootfs)
    assert r.returncode == 0
    assert (lib / "libcuda.so.1").read_bytes() == b"the image's own"
    assert os.readlink(lib / "libcuda.so") == f"{FOLDER}/libcuda.so.1"
    assert (rootfs / "etc/ld.so.conf.d/00-nodeprep-nvidia.conf").read_text() == f"{FOLDER}\n"
    assert_rebuilt_by_the_node(rootfs, b"glibc-ld.so.cache1.1", r)


def test_hook_follows_no_link_of_a_hostile_image_out_of_its_rootfs(tmp_path: Path) -> None:
    """The hook runs before pivot_root, so an image's absolute link resolves against the node's root.
    A /usr/lib64 that is a link out of the rootfs (to a folder holding a libc.so.6) neither makes the
    image a lib64 one nor gets links written through it; a multiarch directory reached through a
    link is not written either (the hook says so, the container starts without the links)."""
    outside = tmp_path / "node-lib64"
    outside.mkdir()
    (outside / "libc.so.6").write_bytes(b"\x7fELF")
    rootfs = tmp_path / "rootfs"
    (rootfs / "usr").mkdir(parents=True)
    (rootfs / "usr/lib64").symlink_to(outside)
    (rootfs / "etc").mkdir()
    r = link_hook(tmp_path, rootfs)
    assert (r.returncode, r.stderr) == (0, "")
    assert sorted(p.name for p in outside.iterdir()) == ["libc.so.6"]  # nothing written through the link
    made = set(links_in(rootfs / MULTIARCH.lstrip("/")))
    assert made == {"libcuda.so.535.309.01", "libcuda.so.1", "libcuda.so"}
    assert link_dir(str(rootfs), MULTIARCH) == MULTIARCH

    outside_lib = tmp_path / "node-lib"
    outside_lib.mkdir()
    shutil.rmtree(rootfs / "usr/lib")
    (rootfs / "usr/lib").symlink_to(outside_lib)
    r = link_hook(tmp_path, rootfs)
    assert r.returncode == 0
    assert r.stderr.strip() == ("nodeprep hook: libraries not linked (Not a directory: a link or no folder "
                                f"at {MULTIARCH} in the image)")
    assert list(outside_lib.iterdir()) == []
    with pytest.raises(OSError):  # the same for a lib64 image's directory
        _open_dir(str(rootfs), LIB64)
    assert sorted(p.name for p in outside.iterdir()) == ["libc.so.6"]


@pytest.mark.parametrize("compat", [True, False])
def test_hook_runs_nvidia_enable_cuda_compat_only_for_an_image_with_compat_libraries(
        tmp_path: Path, compat: bool) -> None:
    """With `--nvidia-cdi-hook`, NVIDIA's enable-cuda-compat (here a stand-in program recording its
    arguments and stdin) runs from nodeprep's hook, the OCI state on its stdin, only when the image
    has CUDA compat libraries; every other start is spared that second process. Its failure refuses
    the container, as the runtime did when it ran NVIDIA's hook itself."""
    rootfs = image(tmp_path, "debian")
    if compat:
        (rootfs / "usr/local/cuda/compat").mkdir(parents=True)
        (rootfs / "usr/local/cuda/compat/libcuda.so.550.54.15").write_bytes(b"\x7fELF")
    tool = tmp_path / "nvidia-cdi-hook"
    tool.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/ran\ncat >> {tmp_path}/ran\nexit ${{FAIL:-0}}\n")
    tool.chmod(0o755)
    args = ["--ldconfig", MULTIARCH, "--nvidia-cdi-hook", str(tool), "--libraries", FOLDER, *LINKS]
    r = run_hook(tmp_path, ["PATH=/usr/bin"], extra=args, config={"root": {"path": str(rootfs)}})
    assert (r.returncode, r.stderr) == (0, "")
    assert links_in(rootfs / MULTIARCH.lstrip("/"))["libcuda.so.1"] == f"{FOLDER}/libcuda.so.1"
    if not compat:
        assert not (tmp_path / "ran").exists()
        return
    argv, state = (tmp_path / "ran").read_text().split("\n", 1)
    assert argv == "enable-cuda-compat --host-driver-version=535.309.01"
    assert json.loads(state)["bundle"] == str(tmp_path / "bundle")
    tool.write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    r = run_hook(tmp_path, ["PATH=/usr/bin"], extra=args, config={"root": {"path": str(rootfs)}})
    assert r.returncode == 1
    assert r.stderr.startswith("nodeprep hook: nvidia-cdi-hook enable-cuda-compat failed:"), r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2 and "Traceback" not in r.stderr


def test_disable_device_node_modification_needs_the_nvidia_hook_and_fails_in_one_line(tmp_path: Path) -> None:
    """The spec asks nodeprep's hook to become NVIDIA's disable-device-node-modification when done
    (the real binary doing it: tests/slow/join/test_cdi_toolkit.py); a refused container never gets
    there, and a hook that cannot be run fails the start with one line."""
    alone = run_hook(tmp_path, [], extra=["--disable-device-node-modification"])
    assert alone.returncode == 1
    assert alone.stderr.strip() == ("nodeprep hook: --disable-device-node-modification needs "
                                    "--nvidia-cdi-hook PATH")
    missing = str(tmp_path / "no-such-nvidia-cdi-hook")
    extra = ["--nvidia-cdi-hook", missing, "--disable-device-node-modification"]
    failed = run_hook(tmp_path, [], extra=extra)
    assert failed.returncode == 1 and len(failed.stderr.strip().splitlines()) == 1
    assert failed.stderr.startswith("nodeprep hook: nvidia-cdi-hook disable-device-node-modification "
                                    "failed: ")
    assert "No such file or directory" in failed.stderr
    refused = run_hook(tmp_path, [f"NVIDIA_REQUIRE_CUDA={REQUIRE_12_4}"], extra=extra)
    assert refused.returncode == 1 and refused.stderr.startswith("nodeprep: container refused: ")
