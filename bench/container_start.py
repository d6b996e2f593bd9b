#!/usr/bin/env python3
"""Benchmark what nodeprep's CDI spec adds to a container start (goal: <= 50 ms median).

Podman 4.3 starts `true` in a Debian 12 rootfs (mmdebstrap, cached under NODEPREP_TEST_CACHE/cdi)
through CDI specs that differ only in what nodeprep adds, measured side by side (interleaved) N times.
Every spec has one device (a /dev/null stand-in node) and mounts the library files of the real
535.309.01 compute user space (the 11 names of the shared real build: 6 files + 5 soname links;
stand-ins here: tiny shared objects built with gcc under the same names and sonames) into the
multiarch directory, as any CDI spec for the driver must:

- none: only that;
- /bin/true: plus a hook that does nothing (what running any hook costs the runtime), for information;
- hook: plus nodeprep's hook (the program /usr/libexec/nodeprep/cdi-hook, written here under a temp
  dir) as `nodeprep runtime` writes it without NVIDIA's nvidia-cdi-hook
  (`--driver 535.309.01 --ldconfig DIR`; NVIDIA_REQUIRE_CUDA of a real CUDA 12.2 image checked, and
  the image's ld.so.cache found not to name another copy of a mounted library);
- lib64: plus the same files mounted into /usr/lib64 too (the RHEL/UBI loader's default directory);
- spec: hook + lib64, what nodeprep's spec adds now: the figure held against the goal;
- spec, cache rebuilt: the same on an image whose ld.so.cache names its own libcuda.so.1
  (/usr/local/cuda/compat), so the hook runs the image's ldconfig; for information.

Podman runs as root in a private mount namespace (tmpfs over /run holding the specs in /run/cdi)
with its storage in a temp dir; nothing of the host's container setup is used or changed.

    python3 bench/container_start.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchlib import Goals, cannot_measure, run, use_venv  # noqa: E402  (bench/benchlib.py)

use_venv()

from nodeprep.hooks.container import LIB64  # noqa: E402
from nodeprep.join.files import apply_changes  # noqa: E402
from nodeprep.join.hookprogram import hook_command, hook_program  # noqa: E402

GOAL_S = 0.050
REQUIRE = "cuda>=12.2 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471"
# This sandbox caps RLIMIT_NOFILE/NPROC below podman's container defaults, which runc cannot raise.
ULIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]
MULTIARCH = "/usr/lib/x86_64-linux-gnu"
VERSION = "535.309.01"
LIBS = {  # the real 535.309.01 build's lib64: file -> soname (ldconfig -n makes the soname links)
    f"libcuda.so.{VERSION}": "libcuda.so.1",
    f"libnvidia-cfg.so.{VERSION}": "libnvidia-cfg.so.1",
    f"libnvidia-ml.so.{VERSION}": "libnvidia-ml.so.1",
    f"libnvidia-nvvm.so.{VERSION}": "libnvidia-nvvm.so.4",
    f"libnvidia-pkcs11-openssl3.so.{VERSION}": None,
    f"libnvidia-ptxjitcompiler.so.{VERSION}": "libnvidia-ptxjitcompiler.so.1",
}


def stand_in_libs(work: Path) -> Path:
    """Tiny shared objects under the real file names, each with its real soname."""
    lib = work / "driver"
    lib.mkdir()
    (work / "lib.c").write_text("int nodeprep_bench(void) { return 0; }\n")
    for name, soname in LIBS.items():
        subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname or name}", "-o", lib / name,
                        work / "lib.c"], check=True)
    return lib


def lib_mounts(lib: Path, dirs: tuple[str, ...]) -> list[dict]:  # type: ignore[type-arg]
    pairs = [(n, n) for n in LIBS] + [(so, n) for n, so in LIBS.items() if so]
    return [{"hostPath": str(lib / src), "containerPath": f"{d}/{name}", "options": ["ro", "nosuid", "nodev",
             "rbind", "rprivate"]} for d in dirs for name, src in pairs]


def spec(kind: str, hooks: list[dict], mounts: list[dict]) -> dict:  # type: ignore[type-arg]
    edits: dict = {"deviceNodes": [{"path": "/dev/nodeprep-bench", "hostPath": "/dev/null"}]}  # type: ignore[type-arg]
    edits["mounts"] = mounts
    if hooks:
        edits["hooks"] = hooks
    return {"cdiVersion": "0.5.0", "kind": kind, "devices": [{"name": "dev", "containerEdits": edits}]}


def slug(name: str) -> str:
    return name.strip("/").replace("+", "-").replace("/", "-").replace(", ", "-").replace(" ", "-")


def rootfs_tar() -> Path:
    cache = Path(os.environ.get("NODEPREP_TEST_CACHE", Path.home() / ".cache/nodeprep-tests")) / "cdi"
    tar = cache / "debian12-essential.tar"
    if not tar.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = tar.with_suffix(".part.tar")
        subprocess.run(["mmdebstrap", "--quiet", "--variant=essential", "bookworm", str(tmp)], check=True)
        tmp.rename(tar)
    return tar


def hook_cpu(work: Path, rootfs: Path, hook: dict, mounts: list[dict], runs: int) -> dict[str, float]:  # type: ignore[type-arg]
    """CPU seconds per run of the hook process alone (state on stdin, a config.json as podman
    writes it: the spec's mounts and the CUDA 12.2 requirement), next to a bare interpreter start:
    less sensitive to the machine's load than wall time."""
    bundle = work / "bundle"
    bundle.mkdir()
    config = {"ociVersion": "1.0.2", "root": {"path": str(rootfs)},
              "process": {"args": ["true"], "env": ["PATH=/usr/bin", f"NVIDIA_REQUIRE_CUDA={REQUIRE}"]},
              "mounts": [{"destination": m["containerPath"], "type": "bind", "source": m["hostPath"],
                          "options": m["options"]} for m in mounts]}
    (bundle / "config.json").write_text(json.dumps(config))
    state = json.dumps({"ociVersion": "1.0.2", "id": "bench", "status": "creating", "pid": 1,
                        "bundle": str(bundle)})
    argvs = {"python -S -E (empty)": [hook["path"], "-S", "-E", "-c", "pass"], "hook": hook["args"]}
    out = {}
    for name, argv in argvs.items():
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        for _ in range(runs):
            subprocess.run(argv, executable=hook["path"], input=state, text=True, check=True,
                           capture_output=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        out[name] = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / runs
    return out


INNER = r"""
set -e
mount -t tmpfs tmpfs /run
mkdir /run/cdi
cp "$1"/*.json /run/cdi/
shift
exec "$@"
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    for tool in ("podman", "unshare", "mmdebstrap", "gcc", "chroot"):
        if shutil.which(tool) is None:
            cannot_measure(f"{tool} is missing (scripts/deps/join.apt)")
    true_hook = {"hookName": "createContainer", "path": "/bin/true", "args": ["true"]}
    with tempfile.TemporaryDirectory(prefix="nodeprep-bench-") as tmp:
        work = Path(tmp)
        program = hook_program(work / "node")  # the program nodeprep writes on a node, here under work
        apply_changes([program])
        _, argv, env = hook_command()
        ours = {"hookName": "createContainer", "path": str(program.path),
                "args": [*argv, "--driver", VERSION, "--ldconfig", MULTIARCH]}
        if env:
            ours["env"] = env
        lib = stand_in_libs(work)
        one, both = lib_mounts(lib, (MULTIARCH,)), lib_mounts(lib, (MULTIARCH, LIB64))
        # name: (hooks, mounts, image)
        variants = {"none": ([], one, "plain"), "/bin/true": ([true_hook], one, "plain"),
                    "hook": ([ours], one, "plain"), "lib64": ([], both, "plain"),
                    "spec": ([ours], both, "plain"), "spec, cache rebuilt": ([ours], both, "compat")}
        images = {}
        for image in ("plain", "compat"):
            rootfs = images[image] = work / f"rootfs-{image}"
            rootfs.mkdir()
            with tarfile.open(rootfs_tar()) as t:
                t.extractall(rootfs, filter="fully_trusted")
        compat = images["compat"] / "usr/local/cuda/compat"
        compat.mkdir(parents=True)
        shutil.copy(lib / f"libcuda.so.{VERSION}", compat / "libcuda.so.550.54.15")
        (images["compat"] / "etc/ld.so.conf.d/000_cuda_compat.conf").write_text("/usr/local/cuda/compat\n")
        subprocess.run(["chroot", images["compat"], "ldconfig"], check=True)
        specs = work / "specs"
        specs.mkdir()
        for name, (hooks, mounts, _) in variants.items():
            kind = f"bench.nodeprep.dev/{slug(name)}"
            (specs / f"{slug(name)}.json").write_text(json.dumps(spec(kind, hooks, mounts)))
        podman = ["podman", "--root", f"{work}/p/root", "--runroot", f"{work}/p/run", "--tmpdir",
                  f"{work}/p/tmp", "--cgroup-manager", "cgroupfs", "--events-backend", "none"]
        # one shell in the private namespace runs every start and prints its wall time in ns
        loop = []
        for i in range(args.runs + 1):  # the first round warms podman's storage up and is dropped
            for name, (_, _, image) in variants.items():
                kind = f"bench.nodeprep.dev/{slug(name)}"
                run = [*podman, "run", "--rm", "--network", "none", *ULIMITS, "--device", f"{kind}=dev",
                       "--env", f"NVIDIA_REQUIRE_CUDA={REQUIRE}", "--rootfs", str(images[image]), "true"]
                quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in run)
                loop.append(
                    f"s=$(date +%s%N); {quoted} >/dev/null; e=$(date +%s%N); echo {i} {slug(name)} $((e-s))"
                )
        script = work / "loop.sh"
        script.write_text("set -e\n" + "\n".join(loop) + "\n")
        out = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", INNER, "sh", str(specs),
             "sh", str(script)],
            capture_output=True, text=True, timeout=1800,
        )
        if out.returncode != 0:
            cannot_measure(f"a container start failed:\n{out.stderr[-2000:]}")
        cpu = hook_cpu(work, images["plain"], ours, both, args.runs)
    times: dict[str, list[float]] = {slug(n): [] for n in variants}
    for line in out.stdout.splitlines():
        i, name, ns = line.split()
        if int(i) > 0:
            times[name].append(int(ns) / 1e9)
    base = statistics.median(times["none"])
    goals = Goals()
    names = {slug(n): n for n in variants}
    print(f"podman 4.3 container start, median of {args.runs} (interleaved), {time.strftime('%Y-%m-%d')}")
    for name, ts in times.items():
        med = statistics.median(ts)
        added = med - base
        line = (f"{names[name]:<20} median {med * 1000:7.1f} ms  added {added * 1000:6.1f} ms  "
                f"ratio {med / base:5.2f}")
        if name == "spec":
            verdict = goals.at_most(f"spec adds <= {GOAL_S * 1000:.0f} ms", added, GOAL_S)
            line += f"  goal added <= {GOAL_S * 1000:.0f} ms  added/goal {added / GOAL_S:5.2f}  {verdict}"
        print(line)
    per_run = ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in cpu.items())
    print(f"the hook process alone, CPU time (user+sys) per run, {args.runs} runs: {per_run}")
    print("load average during the run: " + " ".join(f"{x:.1f}" for x in os.getloadavg()))
    return goals.exit_code()


if __name__ == "__main__":
    run(main)
