"""A hostile container against nodeprep's hooks (#35): the hook program run as the runtime runs it
(tests/unit/containerhooks/test_container_hook.py's `run_hook`: a real process, the OCI state on
stdin, a config.json in the bundle), with an image written here. No GPU and no container runtime:
the starts through real podman/runc and containerd are in tests/slow/join/test_hostile_images.py.

What must hold: every hook entry nodeprep writes carries its own environment (a runtime starts a hook
without one with the container's, LD_PRELOAD included: NVIDIA's CVE-2025-23266); every process a
hook starts gets HOOK_ENV alone, whatever the hook was started with; the image's own ldconfig is
never run, and the node's cannot reach out of the image, not even through /proc/1/root.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from nodeprep.containerhooks.container import HOOK_ENV, LDCONFIG
from nodeprep.runtime import cdi, containerd, ocihooks
from nodeprep.runtime.hookprogram import hook_env

from .test_container_hook import FOLDER, LINKS, MULTIARCH, image, installed_hook

HOSTILE = {"LD_LIBRARY_PATH": "/tmp/evil", "PYTHONPATH": "/tmp/evil", "GCONV_PATH": "/tmp/evil",
           "PATH": "/tmp/evil", "HOME": "/tmp/evil", "TMPDIR": "/tmp/evil", "https_proxy": "http://evil:1"}
root_only = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                               reason="mount namespaces need root and util-linux unshare")


def test_every_hook_entry_nodeprep_writes_carries_its_own_environment() -> None:
    """The CDI spec's hook, the hooks.d gate and containerd's base spec: each names HOOK_ENV as its
    whole environment, never an empty one (an empty `env` is dropped on the way to runc: inherited)."""
    want = [f"{k}={v}" for k, v in HOOK_ENV.items()]
    assert hook_env() == want and want
    spec_hooks = cdi.spec_hooks("535.309.01", MULTIARCH, "/usr/bin/nvidia-cdi-hook", ["libcuda.so.1"],
                                params=True)
    hooks_d = json.loads(ocihooks.render_hooks_d())["hook"]
    default = {"process": {}, "root": {}, "mounts": [], "linux": {}, "hooks": {"createContainer": [
        {"path": ocihooks.gate_hook()["path"], "args": ["cdi-hook", "gate"]}]}}  # an earlier nodeprep's
    base = json.loads(containerd.render_base_spec(default, ocihooks.gate_hook()))["hooks"]["createContainer"]
    assert len(base) == 1, "the earlier gate entry (no env) is replaced, not kept beside"
    for hook in [*spec_hooks, hooks_d, *base]:
        assert hook["env"] == want, hook


def record_env_tool(tmp_path: Path) -> Path:
    """A stand-in nvidia-cdi-hook (python, which adds no variable of its own) recording its
    environment and working directory per subcommand."""
    tool = tmp_path / "nvidia-cdi-hook"
    tool.write_text("#!/usr/bin/python3 -I\nimport json, os, sys\n"
                    "json.dump({'env': dict(os.environ), 'cwd': os.getcwd()}, "
                    f"open('{tmp_path}/' + sys.argv[1], 'w'))\n"
                    "sys.stdin.read()\n")
    tool.chmod(0o755)
    return tool


def run_hook_with_env(tmp_path: Path, rootfs: Path, extra: list[str], env: dict[str, str],
                      cwd: Path) -> subprocess.CompletedProcess[str]:
    """The hook started as a runtime starts an entry without `env`: with the container's environment
    and in its rootfs (what a spec of an earlier nodeprep, or another tool's, gets)."""
    bundle = tmp_path / "bundle"
    bundle.mkdir(exist_ok=True)
    (bundle / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.2", "process": {"args": ["sh"], "env": [f"{k}={v}" for k, v in env.items()]},
        "root": {"path": str(rootfs)}}))
    state = {"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 1, "bundle": str(bundle)}
    path, argv, _ = cdi.hook_command()
    return subprocess.run([*argv, "--driver", "535.309.01", *extra], executable=installed_hook(tmp_path),
                          input=json.dumps(state), capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=60)


def test_what_a_hook_starts_gets_the_hook_environment_alone(tmp_path: Path) -> None:
    """Started with a hostile environment (HOME, TMPDIR, a proxy, PATH, PYTHONPATH, GCONV_PATH,
    LD_LIBRARY_PATH), the hook passes none of it on: NVIDIA's enable-cuda-compat (run for an image
    with compat libraries) and disable-device-node-modification (which the hook becomes) see HOOK_ENV
    alone, in /."""
    rootfs = image(tmp_path, "debian")
    (rootfs / "usr/local/cuda/compat").mkdir(parents=True)
    (rootfs / "usr/local/cuda/compat/libcuda.so.550.54.15").write_bytes(b"\x7fELF")
    tool = record_env_tool(tmp_path)
    extra = ["--ldconfig", MULTIARCH, "--nvidia-cdi-hook", str(tool), "--disable-device-node-modification",
             "--libraries", FOLDER, *LINKS]
    r = run_hook_with_env(tmp_path, rootfs, extra, HOSTILE, cwd=rootfs)
    assert r.returncode == 0, r.stderr
    for command in ("enable-cuda-compat", "disable-device-node-modification"):
        seen = json.loads((tmp_path / command).read_text())
        assert seen == {"env": HOOK_ENV, "cwd": "/"}, command


def hostile_ldconfig_image(tmp_path: Path) -> Path:
    """A Debian-layout image with its own libcuda.so.1 (the trigger for an ld cache rebuild) and an
    /sbin/ldconfig and /usr/sbin/ldconfig of its own that leave a mark when run."""
    rootfs = image(tmp_path, "debian")
    (rootfs / MULTIARCH.lstrip("/") / "libcuda.so.1").write_bytes(b"the image's own")
    (rootfs / "bin").mkdir()
    shutil.copy("/bin/busybox", rootfs / "bin/sh")
    for tool in LDCONFIG:
        (rootfs / tool.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (rootfs / tool.lstrip("/")).write_text("#!/bin/sh\necho ran > /image-ldconfig-ran\n")
        (rootfs / tool.lstrip("/")).chmod(0o755)
    return rootfs


def test_the_image_ldconfig_is_never_run(tmp_path: Path) -> None:
    """A shadowed library makes the hook rebuild the image's ld cache: with the node's ldconfig, not
    the image's (which a hook of before ran chrooted, as root, with every capability)."""
    rootfs = hostile_ldconfig_image(tmp_path)
    r = run_hook_with_env(tmp_path, rootfs, ["--ldconfig", MULTIARCH, "--libraries", FOLDER, *LINKS],
                          dict(HOOK_ENV), cwd=Path("/"))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert not (rootfs / "image-ldconfig-ran").exists()
    cache = (rootfs / "etc/ld.so.cache").read_bytes()
    assert cache.startswith(b"glibc-ld.so.cache") and cache != b"glibc-ld.so.cache1.1"  # rebuilt


@root_only
def test_the_node_ldconfig_cannot_leave_the_image_through_proc(tmp_path: Path) -> None:
    """Before pivot_root the container's /proc is mounted and its PID 1 is the runtime's init, whose
    root is the node's: a chrooted ldconfig following /proc/1/root/... would scan and write the
    node's folders. Here the node's own /proc stands for it (bind-mounted over the image's /proc in
    a private mount namespace) and a process of this test for the runtime's init (PID 1 of this
    machine may be out of reach); the image lists /proc/<its pid>/root/<a node folder holding a
    library without its soname link> in its ld.so.conf and links its aux-cache folder there. The
    node's folder stays as it was, and the rebuilt cache names nothing of it. The image also has a
    real ldconfig of its own (a copy of the node's): the hook of before ran that one, chrooted, and
    it went out (it made the node's libfoo.so.1 link)."""
    rootfs = image(tmp_path, "debian")
    (rootfs / MULTIARCH.lstrip("/") / "libcuda.so.1").write_bytes(b"the image's own")
    node_dir = tmp_path / "node-lib"
    node_dir.mkdir()
    (tmp_path / "foo.c").write_text("int foo(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libfoo.so.1", "-o", node_dir / "libfoo.so.1.0",
                    tmp_path / "foo.c"], check=True, timeout=120)
    (rootfs / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (rootfs / "etc/ld.so.conf.d").mkdir()
    init = subprocess.Popen(["sleep", "120"])  # the runtime's init: its root is the node's
    (rootfs / "etc/ld.so.conf.d/libc.conf").write_text(f"/proc/{init.pid}/root{node_dir}\n")
    (rootfs / "var/cache").mkdir(parents=True)
    (rootfs / "var/cache/ldconfig").symlink_to(f"/proc/{init.pid}/root{node_dir}")
    (rootfs / "sbin").mkdir()
    shutil.copy(next(t for t in LDCONFIG if Path(t).is_file()), rootfs / "sbin/ldconfig")
    before = sorted(p.name for p in node_dir.iterdir())

    program = installed_hook(tmp_path)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "process": {"env": []},
                                                    "root": {"path": str(rootfs)}}))
    state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 1,
                        "bundle": str(bundle)})
    _, argv, _ = cdi.hook_command()
    hook = [str(program), *argv[1:], "--driver", "535.309.01", "--ldconfig", MULTIARCH,
            "--libraries", FOLDER, *LINKS]
    script = 'mount --rbind /proc "$1/proc" && shift && exec "$@"'
    try:
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                            str(rootfs), *hook], input=state, capture_output=True, text=True,
                           env=dict(HOOK_ENV), timeout=60)
    finally:
        init.kill()
        init.wait()
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert sorted(p.name for p in node_dir.iterdir()) == before  # no libfoo.so.1 link, no aux-cache
    cache = (rootfs / "etc/ld.so.cache").read_bytes()
    assert b"libfoo" not in cache and cache != b"glibc-ld.so.cache1.1"  # rebuilt, of the image alone
