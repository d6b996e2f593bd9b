#!/usr/bin/env python3
"""Benchmark what nodeprep's createContainer hook adds to a container start (goal: <= 50 ms median).

Podman 4.3 starts `true` in a Debian 12 rootfs (mmdebstrap, cached under NODEPREP_TEST_CACHE/cdi)
through three CDI specs that differ only in their hooks, measured side by side (interleaved) N times:

- none: one device (a /dev/null stand-in node), no hook;
- hook: the same plus nodeprep's hook as `nodeprep runtime` writes it (NVIDIA_REQUIRE_CUDA check of a
  real CUDA 12.2 image value against driver 535.309.01);
- hook+ldcache: the hook also refreshes the image's ld cache (written when NVIDIA's nvidia-cdi-hook
  is not installed), reported for information;
- /bin/true: a hook that does nothing, for information: what running any hook costs the runtime.

Podman runs as root in a private mount namespace (tmpfs over /run holding the specs in /run/cdi)
with its storage in a temp dir; nothing of the host's container setup is used or changed.

    python3 bench/container_start.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
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

from nodeprep.join.cdi import hook_command  # noqa: E402

GOAL_S = 0.050
REQUIRE = "cuda>=12.2 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471"
# This sandbox caps RLIMIT_NOFILE/NPROC below podman's container defaults, which runc cannot raise.
ULIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]


def spec(kind: str, hooks: list[dict]) -> dict:  # type: ignore[type-arg]
    edits: dict = {"deviceNodes": [{"path": "/dev/nodeprep-bench", "hostPath": "/dev/null"}]}  # type: ignore[type-arg]
    if hooks:
        edits["hooks"] = hooks
    return {"cdiVersion": "0.5.0", "kind": kind, "devices": [{"name": "dev", "containerEdits": edits}]}


def slug(name: str) -> str:
    return name.strip("/").replace("+", "-").replace("/", "-")


def rootfs_tar() -> Path:
    cache = Path(os.environ.get("NODEPREP_TEST_CACHE", Path.home() / ".cache/nodeprep-tests")) / "cdi"
    tar = cache / "debian12-essential.tar"
    if not tar.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = tar.with_suffix(".part.tar")
        subprocess.run(["mmdebstrap", "--quiet", "--variant=essential", "bookworm", str(tmp)], check=True)
        tmp.rename(tar)
    return tar


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
    for tool in ("podman", "unshare", "mmdebstrap"):
        if shutil.which(tool) is None:
            cannot_measure(f"{tool} is missing (scripts/deps/join.apt)")
    path, argv, env = hook_command()
    check = {"hookName": "createContainer", "path": path, "args": [*argv, "--driver", "535.309.01"]}
    if env:
        check["env"] = env
    ldcache = {**check, "args": [*check["args"], "--ldconfig", "/usr/lib/x86_64-linux-gnu"]}
    true_hook = {"hookName": "createContainer", "path": "/bin/true", "args": ["true"]}
    variants = {"none": [], "/bin/true": [true_hook], "hook": [check], "hook+ldcache": [ldcache]}
    with tempfile.TemporaryDirectory(prefix="nodeprep-bench-") as tmp:
        work = Path(tmp)
        rootfs = work / "rootfs"
        rootfs.mkdir()
        with tarfile.open(rootfs_tar()) as t:
            t.extractall(rootfs, filter="fully_trusted")
        specs = work / "specs"
        specs.mkdir()
        for name, hooks in variants.items():
            kind = f"bench.nodeprep.dev/{slug(name)}"
            (specs / f"{slug(name)}.json").write_text(json.dumps(spec(kind, hooks)))
        podman = ["podman", "--root", f"{work}/p/root", "--runroot", f"{work}/p/run", "--tmpdir",
                  f"{work}/p/tmp", "--cgroup-manager", "cgroupfs", "--events-backend", "none"]
        # one shell in the private namespace runs every start and prints its wall time in ns
        loop = []
        for i in range(args.runs + 1):  # the first round warms podman's storage up and is dropped
            for name in variants:
                kind = f"bench.nodeprep.dev/{slug(name)}"
                run = [*podman, "run", "--rm", "--network", "none", *ULIMITS, "--device", f"{kind}=dev",
                       "--env", f"NVIDIA_REQUIRE_CUDA={REQUIRE}", "--rootfs", str(rootfs), "true"]
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
        line = (f"{names[name]:<14} median {med * 1000:7.1f} ms  added {added * 1000:6.1f} ms  "
                f"ratio {med / base:5.2f}")
        if name == "hook":
            line += f"  goal added <= {GOAL_S * 1000:.0f} ms  added/goal {added / GOAL_S:5.2f}"
        print(line)
    goals.at_most(f"hook adds <= {GOAL_S * 1000:.0f} ms", statistics.median(times["hook"]) - base, GOAL_S)
    return goals.exit_code()


if __name__ == "__main__":
    run(main)
