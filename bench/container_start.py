#!/usr/bin/env python3
"""Benchmark what nodeprep's CDI spec adds to a container start (goal: <= 50 ms median).

Podman 4.3 starts `true` in a Debian 12 rootfs (mmdebstrap, cached under NODEPREP_TEST_CACHE/cdi)
through CDI specs that differ only in what nodeprep adds, measured side by side (interleaved) N times.
Every spec has one device (a /dev/null stand-in node) and the library files of the real 535.309.01
compute user space (the 11 names of the shared real build: 6 files + 5 soname links; stand-ins here:
tiny shared objects built with gcc under the same names and sonames, their soname links made as
ldconfig -n makes them in a driver root):

- none: those names mounted file by file into the multiarch directory (what any spec without a hook
  must mount for the loader to find them): the baseline;
- /bin/true: plus a hook that does nothing (what running any hook costs the runtime), for information;
- hook: plus nodeprep's hook (the program /usr/libexec/nodeprep/cdi-hook, written here under a temp
  dir) with `--driver 535.309.01 --ldconfig DIR` only (NVIDIA_REQUIRE_CUDA of a real CUDA 12.2 image
  checked, the image's ld.so.cache found not to name another copy of a mounted library), for information;
- folder: instead, the library folder mounted once at its host path, no hook (the mounts of nodeprep's
  spec alone: the loader finds nothing through them), for information;
- spec: what nodeprep's spec adds now: the folder mount and nodeprep's hook as `nodeprep runtime`
  writes it without NVIDIA's nvidia-cdi-hook (`--libraries` and a `--link` per name, libcuda.so
  included: the hook links them in the multiarch directory of its own image): the figure held against
  the goal;
- spec, cache rebuilt: the same on an image whose ld.so.cache names its own libcuda.so.1
  (/usr/local/cuda/compat), so the hook runs the image's ldconfig; for information;
- spec of before: the spec until 2026-11-26: each name mounted into the multiarch directory and
  /usr/lib64 (the RHEL/UBI loader's), libcuda.so too, and the hook without links; for information;
- gate, no GPU / gate, GPU: the CUDA gate (nodeprep.containerhooks.gate) run by podman from the hooks.d file
  `nodeprep runtime` writes (`--hooks-dir`; the other variants get an empty one), on the `none`
  spec (its device is no NVIDIA one: the gate exits at once) and on a spec like a DRA claim's (the
  same mounts, device node /dev/nvidia0, no hook of its own: the gate checks NVIDIA_REQUIRE_CUDA
  against a `current` link to 535.309.01 and Tesla facts); goal: <= 50 ms each and, where
  NVIDIA's nvidia-cdi-hook is at hand, `gate, GPU` <= half of what `nvidia` adds;
- true, hooks dir: the `none` spec with a hooks.d file of the gate's form running /bin/true (what
  running any hooks.d hook costs podman), for information: the gate's own overhead is each gate row
  minus this one, printed in ms;
- spec + nvidia-cdi-hook: what nodeprep's spec adds on a GPU node with NVIDIA's nvidia-cdi-hook: the
  hook nodeprep.runtime.cdi.spec_hooks writes where the driver is loaded (its params file present):
  nodeprep's as in `spec` with `--nvidia-cdi-hook` naming the real binary (NODEPREP_NVIDIA_BIN,
  tests/support/nvidia.py), which it runs for enable-cuda-compat only in an image with CUDA compat
  libraries (not this one), and `--disable-device-node-modification`: it becomes NVIDIA's hook of
  that name when done; on the folder mount;
- nvidia: a spec of the form `nvidia-ctk cdi generate` writes for the same files on a GPU node
  (v1.20.0 in its default NVML mode, as on the H200:
  tests/fixtures/gpu-machine/h200_580.159.04.nvidia-ctk.yaml; toolkit sources pkg/nvcdi/driver-nvml.go
  and common-nvml.go): the libraries mounted at their host path, then the hooks create-symlinks for
  their soname links and libcuda.so, enable-cuda-compat, update-ldcache of that folder,
  disable-device-node-modification and update-application-profile,
  each a run of the real binary with NVIDIA_CTK_DEBUG=false. (`--mode management`, the oracle of
  tests/slow/join/test_cdi_parity.py, leaves disable-device-node-modification out; a node's spec is
  NVML mode's.) Here, with no driver loaded, disable-device-node-modification finds no params file
  and update-application-profile no GPU device node: each returns at once, in both specs.
`spec` and `spec + nvidia-cdi-hook` must each add at most half of what `nvidia` adds. Without
NODEPREP_NVIDIA_BIN the last two are left out and said so.

Podman runs as root in a private mount namespace (tmpfs over /run holding the specs in /run/cdi)
with its storage in a temp dir; nothing of the host's container setup is used or changed.

    python3 bench/container_start.py [--runs N] [--only SLUG,...]
        (a variant's slug: its words joined by '-': spec, spec-nvidia-cdi-hook, gate-GPU, bin-true, ...)
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

from nodeprep.runtime.cdi import EXTRA_NAMES, spec_hooks  # noqa: E402
from nodeprep.runtime.files import apply_changes  # noqa: E402
from nodeprep.runtime.hookprogram import HOOK_PATH, hook_command, hook_program  # noqa: E402
from nodeprep.runtime.ocihooks import HOOK_NAME, render_hooks_d  # noqa: E402

GOAL_S = 0.050
GOAL_OF_NVIDIA = 0.5  # nodeprep's spec adds at most half of what a spec of NVIDIA's form adds
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
        if soname:  # as ldconfig -n makes them in the driver root
            (lib / soname).symlink_to(name)
    return lib


def link_args(lib: Path) -> list[str]:
    """nodeprep's hook's --link values for the folder (nodeprep.runtime.cdi._mounts' form)."""
    names = [*LIBS, *(so for so in LIBS.values() if so)]
    names += [f"{n}={so}" for so in LIBS.values() if so for n in EXTRA_NAMES.get(so, ())]
    return [a for n in names for a in ("--link", n)]


def lib_mounts(lib: Path, dirs: tuple[str, ...]) -> list[dict]:  # type: ignore[type-arg]
    pairs = [(n, n) for n in LIBS] + [(so, n) for n, so in LIBS.items() if so]
    return [{"hostPath": str(lib / src), "containerPath": f"{d}/{name}", "options": ["ro", "nosuid", "nodev",
             "rbind", "rprivate"]} for d in dirs for name, src in pairs]


def nvidia_hook_binary() -> str | None:
    """NVIDIA's real nvidia-cdi-hook (NODEPREP_NVIDIA_BIN, sha256-checked), or None without it."""
    if not os.environ.get("NODEPREP_NVIDIA_BIN"):
        return None
    from tests.support import binaries
    from tests.support.nvidia import ENV, SHA_FILE

    cache = Path(os.environ.get("NODEPREP_TEST_CACHE", Path.home() / ".cache/nodeprep-tests")) / "nvidia"
    return str(binaries.verified(ENV, ("nvidia-cdi-hook",), SHA_FILE, cache)["nvidia-cdi-hook"])


def nvidia_form(lib: Path, binary: str) -> tuple[list[dict], list[dict]]:  # type: ignore[type-arg]
    """(hooks, mounts) as `nvidia-ctk cdi generate` writes them for the files in `lib` on a GPU node
    (its default NVML mode; the hooks in the order of the H200's spec, tests/unit/test_bench.py)."""
    mounts = [{"hostPath": str(lib / n), "containerPath": str(lib / n), "options": ["ro", "nosuid", "nodev",
               "rbind", "rprivate"]} for n in LIBS]
    links = [f"{n}::{lib}/{so}" for n, so in LIBS.items() if so] + [f"libcuda.so.1::{lib}/libcuda.so"]
    args = [["create-symlinks", *(a for link in sorted(links) for a in ("--link", link))],
            ["enable-cuda-compat", f"--host-driver-version={VERSION}"],
            ["update-ldcache", "--folder", str(lib)],
            ["disable-device-node-modification"],
            ["update-application-profile"]]
    return [{"hookName": "createContainer", "path": binary, "args": ["nvidia-cdi-hook", *a],
             "env": ["NVIDIA_CTK_DEBUG=false"]} for a in args], mounts


def spec(kind: str, hooks: list[dict], mounts: list[dict], device: str = "/dev/nodeprep-bench") -> dict:  # type: ignore[type-arg]
    edits: dict = {"deviceNodes": [{"path": device, "hostPath": "/dev/null"}]}  # type: ignore[type-arg]
    edits["mounts"] = mounts
    if hooks:
        edits["hooks"] = hooks
    return {"cdiVersion": "0.5.0", "kind": kind, "devices": [{"name": "dev", "containerEdits": edits}]}


def slug(name: str) -> str:
    """A variant's name as --only takes it and its files are named: its words joined by '-'."""
    return "-".join("".join(c if c.isalnum() else " " for c in name).split())


def rootfs_tar() -> Path:
    cache = Path(os.environ.get("NODEPREP_TEST_CACHE", Path.home() / ".cache/nodeprep-tests")) / "cdi"
    tar = cache / "debian12-essential.tar"
    if not tar.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = tar.with_suffix(".part.tar")
        subprocess.run(["mmdebstrap", "--quiet", "--variant=essential", "bookworm", str(tmp)], check=True)
        tmp.rename(tar)
    return tar


def hook_cpu(work: Path, rootfs: Path, hook: dict, mounts: list[dict], runs: int,  # type: ignore[type-arg]
             gate_dir: Path) -> dict[str, float]:
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
    gpu = bundle.parent / "bundle-gpu"  # the same with NVIDIA's device nodes: the gate checks it
    gpu.mkdir()
    config["linux"] = {"devices": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}]}
    (gpu / "config.json").write_text(json.dumps(config))
    state = {"ociVersion": "1.0.2", "id": "bench", "status": "creating", "pid": 1, "bundle": str(bundle)}
    gate_args = json.loads((gate_dir / HOOK_NAME).read_text())["hook"]["args"]
    argvs = {"python -I -S (empty)": (["/usr/bin/python3", "-I", "-S", "-c", "pass"], bundle),
             "hook": (hook["args"], bundle), "gate, no GPU": (gate_args, bundle),
             "gate, GPU": (gate_args, gpu)}
    out = {}
    for name, (argv, where) in argvs.items():
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        for _ in range(runs):
            exe = argv[0] if argv[0].startswith("/") else hook["path"]  # the hook program, by its path
            subprocess.run(argv, executable=exe, input=json.dumps({**state, "bundle": str(where)}),
                           text=True, check=True, capture_output=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        out[name] = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / runs
    return out


def gate_hooks_dir(work: Path, program: str) -> Path:
    """A hooks.d holding the gate's file as `nodeprep runtime` writes it, pointed at a node whose
    driver is VERSION (a `current` link) with one Tesla GPU's recorded facts."""
    opt = work / "opt/nvidia"
    (opt / VERSION).mkdir(parents=True)
    (opt / "current").symlink_to(VERSION)
    (opt / "gpu-facts.json").write_text(json.dumps({"gpus": [{"brand": "tesla", "arch": "7.5"}]}))
    doc = json.loads(render_hooks_d())
    doc["hook"]["path"] = program  # the hook program as written under work, not the node's path
    doc["hook"]["args"] += ["--driver-root", str(opt / "current"), "--facts", str(opt / "gpu-facts.json")]
    hooks = work / "hooks.d"
    hooks.mkdir()
    (hooks / HOOK_NAME).write_text(json.dumps(doc))
    true_hooks = work / "true-hooks.d"  # the same file running /bin/true
    true_hooks.mkdir()
    doc["hook"] = {"path": "/bin/true", "args": ["true"]}
    (true_hooks / HOOK_NAME).write_text(json.dumps(doc))
    return hooks



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
    ap.add_argument("--only", default="", help="comma-separated variants to start besides none, named as "
                    "slugs (spec, spec-nvidia-cdi-hook, gate-GPU, ...; all when empty): more runs of "
                    "fewer rows in the same time")
    args = ap.parse_args()
    for tool in ("podman", "unshare", "mmdebstrap", "gcc", "chroot"):
        if shutil.which(tool) is None:
            cannot_measure(f"{tool} is missing (scripts/deps/join.apt)")
    true_hook = {"hookName": "createContainer", "path": "/bin/true", "args": ["true"]}
    with tempfile.TemporaryDirectory(prefix="nodeprep-bench-") as tmp:
        work = Path(tmp)
        changes = hook_program(work / "node")  # the program nodeprep writes on a node, here under work
        apply_changes(changes)
        program = changes[-1]  # the modules file, then the program that loads it
        _, argv, env = hook_command()
        hook = {"hookName": "createContainer", "path": str(program.path),
                "args": [*argv, "--driver", VERSION, "--ldconfig", MULTIARCH]}
        if env:
            hook["env"] = env
        lib = stand_in_libs(work)
        one, both = lib_mounts(lib, (MULTIARCH,)), lib_mounts(lib, (MULTIARCH, "/usr/lib64"))
        dlopen_names = [{**m, "containerPath": m["containerPath"].replace(".so.1", ".so")} for m in both
                        if m["containerPath"].endswith("/libcuda.so.1")]
        folder = [{"hostPath": str(lib), "containerPath": str(lib), "options": ["ro", "nosuid", "nodev",
                   "rbind", "rprivate"]}]
        ours = {**hook, "args": [*hook["args"], "--libraries", str(lib), *link_args(lib)]}
        # name: (hooks, mounts, image)
        variants = {"none": ([], one, "plain"), "/bin/true": ([true_hook], one, "plain"),
                    "hook": ([hook], one, "plain"), "folder": ([], folder, "plain"),
                    "spec": ([ours], folder, "linked"),
                    "spec, cache rebuilt": ([ours], folder, "compat"),
                    "spec of before": ([hook], both + dlopen_names, "plain")}
        variants["gate, no GPU"] = ([], one, "plain")
        variants["gate, GPU"] = ([], one, "plain")
        variants["true, hooks dir"] = ([], one, "plain")
        gate_dir, no_hooks = gate_hooks_dir(work, str(program.path)), work / "no-hooks.d"
        no_hooks.mkdir()
        gpu_device = {"gate, GPU": "/dev/nvidia0"}
        binary = nvidia_hook_binary()
        if binary:  # each writes into its image (links, ld cache): an image of its own
            with_toolkit = [{**h, "path": str(program.path)} if h["path"] == HOOK_PATH else h
                            for h in spec_hooks(VERSION, MULTIARCH, binary, [], params=True)]
            toolkit_args = [*with_toolkit[-1]["args"], "--libraries", str(lib), *link_args(lib)]
            with_toolkit[-1] = {**with_toolkit[-1], "args": toolkit_args}  # ... --nvidia-cdi-hook BINARY ...
            variants["spec + nvidia-cdi-hook"] = (with_toolkit, folder, "toolkit")
            variants["nvidia"] = (*nvidia_form(lib, binary), "nvidia")
        else:
            print("NODEPREP_NVIDIA_BIN is not set: no NVIDIA hook, no comparison with NVIDIA's spec")
        only = {n.strip() for n in args.only.split(",") if n.strip()}
        slugs = {slug(n) for n in variants}
        if only - slugs:
            cannot_measure(f"--only: no variant {sorted(only - slugs)!r} (there are {sorted(slugs)!r})")
        if only:
            variants = {n: v for n, v in variants.items() if n == "none" or slug(n) in only}
        images = {}
        for image in sorted({v[2] for v in variants.values()}):
            rootfs = images[image] = work / f"rootfs-{image}"
            rootfs.mkdir()
            with tarfile.open(rootfs_tar()) as t:
                t.extractall(rootfs, filter="fully_trusted")
        if "compat" in images:
            compat = images["compat"] / "usr/local/cuda/compat"
            compat.mkdir(parents=True)
            shutil.copy(lib / f"libcuda.so.{VERSION}", compat / "libcuda.so.550.54.15")
            conf = images["compat"] / "etc/ld.so.conf.d/000_cuda_compat.conf"
            conf.write_text("/usr/local/cuda/compat\n")
            subprocess.run(["chroot", images["compat"], "ldconfig"], check=True)
        specs = work / "specs"
        specs.mkdir()
        for name, (hooks, mounts, _) in variants.items():
            kind = f"bench.nodeprep.dev/{slug(name)}"
            device = gpu_device.get(name, "/dev/nodeprep-bench")
            (specs / f"{slug(name)}.json").write_text(json.dumps(spec(kind, hooks, mounts, device)))
        podman = ["podman", "--root", f"{work}/p/root", "--runroot", f"{work}/p/run", "--tmpdir",
                  f"{work}/p/tmp", "--cgroup-manager", "cgroupfs", "--events-backend", "none"]
        # one shell in the private namespace runs every start and prints its wall time in ns
        loop = []
        for i in range(args.runs + 1):  # the first round warms podman's storage up and is dropped
            for name, (_, _, image) in variants.items():
                kind = f"bench.nodeprep.dev/{slug(name)}"
                hooks_dir = (gate_dir if name.startswith("gate") else work / "true-hooks.d"
                             if name == "true, hooks dir" else no_hooks)
                run = [*podman, "--hooks-dir", str(hooks_dir), "run", "--rm", "--network", "none", *ULIMITS,
                       "--device", f"{kind}=dev", "--env", f"NVIDIA_REQUIRE_CUDA={REQUIRE}",
                       "--rootfs", str(images[image]), "true"]
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
        cpu = {} if "linked" not in images else hook_cpu(work, images["linked"], ours, folder, args.runs,
                                                          gate_dir)
    times: dict[str, list[float]] = {slug(n): [] for n in variants}
    for line in out.stdout.splitlines():
        i, name, ns = line.split()
        if int(i) > 0:
            times[name].append(int(ns) / 1e9)
    base = statistics.median(times["none"])

    def added(name: str) -> float:
        """What a row adds to a start: the median of its per-round differences from `none` (the
        rows of one round start one after another, so a change of the machine's load between
        rounds cancels out; the difference of the two medians is printed beside it)."""
        return statistics.median(a - b for a, b in zip(times[name], times["none"], strict=True))

    goals = Goals()
    names = {slug(n): n for n in variants}
    print(f"podman 4.3 container start, median of {args.runs} (interleaved), {time.strftime('%Y-%m-%d')}; "
          "added: the median of the per-round differences from none")
    for name, ts in times.items():
        med = statistics.median(ts)
        line = (f"{names[name]:<20} median {med * 1000:7.1f} ms  added {added(name) * 1000:6.1f} ms  "
                f"(medians' difference {(med - base) * 1000:6.1f})  ratio {med / base:5.2f}")
        if name in ("spec", "gate-no-GPU", "gate-GPU"):
            verdict = goals.at_most(f"{names[name]} adds <= {GOAL_S * 1000:.0f} ms", added(name), GOAL_S)
            line += f"  goal <= {GOAL_S * 1000:.0f} ms  added/goal {added(name) / GOAL_S:5.2f}  {verdict}"
        print(line)
    any_hook = slug("true, hooks dir")
    own = [f"{names[n]} {(added(n) - added(any_hook)) * 1000:.1f} ms" if n in times and any_hook in times
           else f"{n} -" for n in ("gate-no-GPU", "gate-GPU")]
    print(f"the gate's own overhead (a gate row minus true, hooks dir): {', '.join(own)}")
    if "nvidia" in times:
        theirs = added("nvidia")
        for name in [n for n in ("spec", slug("spec + nvidia-cdi-hook"), "gate-GPU") if n in times]:
            verdict = goals.at_most(f"{names[name]} adds <= {GOAL_OF_NVIDIA} x nvidia's", added(name),
                                    GOAL_OF_NVIDIA * theirs)
            print(f"{names[name]} adds {added(name) * 1000:.1f} ms, NVIDIA's form {theirs * 1000:.1f} ms: "
                  f"ratio {added(name) / theirs:4.2f} (goal <= {GOAL_OF_NVIDIA})  {verdict}")
    else:
        print("nvidia: not measured (NODEPREP_NVIDIA_BIN is not set)")
    per_run = ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in cpu.items())
    print(f"the hook processes alone, CPU time (user+sys) per run, {args.runs} runs: {per_run}")
    print("load average during the run: " + " ".join(f"{x:.1f}" for x in os.getloadavg()))
    return goals.exit_code()


if __name__ == "__main__":
    run(main)
