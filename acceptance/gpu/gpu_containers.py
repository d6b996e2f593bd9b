"""Check 8 of acceptance/gpu/gpu-check.sh (--containers): real podman starts on the live GPU.

Needs root, podman (with conmon and runc) on PATH, nvcc (builds the CUDA program) and the node's
/usr/bin/python3 (nodeprep's hook program runs with it). Takes the driver root check 4 mirrored
(WORK/ctr/host/opt/nvidia/<version>, `current`) and, in a private mount namespace (unshare -m) in
which that root is bound at /opt/nvidia, nodeprep's hook program at /usr/libexec/nodeprep and the CDI
specs at /run/cdi (overlays and a tmpfs: nothing outside the namespace and WORK changes), starts
containers from a rootfs of this machine's glibc and a CUDA program built here:

- nodeprep's spec (`nodeprep.runtime.cdi.build_spec`, its own hook): the CUDA program runs a kernel with
  the libcuda the spec mounts, by index and by UUID; `nvidia-smi -L` lists the GPU;
- the CUDA gate (the hooks.d file `nodeprep runtime` writes, `--hooks-dir`), its GPU facts recorded
  as activation records them (nodeprep.node.gpufacts: NVML here): a requirement newer than the
  driver's CUDA is refused with nodeprep's one line, the driver's own is allowed,
  NVIDIA_DISABLE_REQUIRE=1 bypasses; the same for a DRA claim's spec
  (kind k8s.gpu.nvidia.com/claim, device named by a claim UID, no hook of nodeprep's);
- with NVIDIA's binaries, a spec `nvidia-ctk cdi generate --driver-root /` writes (kind
  nvidia.com/ctkgpu, its hooks run by the real nvidia-cdi-hook): the CUDA program runs there too;
- timing: N interleaved starts of `sh -c :` per variant, each on its own copy of the rootfs; prints
  the median and what each adds to a start without a device.

    python3 acceptance/gpu/gpu_containers.py --work WORK --driver VERSION [--nvidia-bin DIR] [--runs N]

Prints one line per finding; exit 0 when every expectation held, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpu_check import copy_into  # acceptance/gpu/gpu_check.py: a binary and the libraries ldd names

from nodeprep import runner
from nodeprep.node import gpufacts
from nodeprep.node.layout import Layout
from nodeprep.profile import Driver
from nodeprep.runtime import cdi, ocihooks
from nodeprep.runtime import gpus as gpumod
from nodeprep.runtime.files import apply_changes
from nodeprep.runtime.hookprogram import hook_program

CLAIM_UID = "0f6b9c2e-3a41-4d7e-9c55-2b8e1d7a6f10"
DRA_KIND = "k8s.gpu.nvidia.com/claim"
SANDBOX = ["--network", "none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]
GLIBC = ("libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1")
CUDA_PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
__global__ void add(int n, const float *a, float *b) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) b[i] += a[i];
}
int main() {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) { printf("cuda error %d: %s\n", (int)e, cudaGetErrorString(e)); return 1; }
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, 0);
    int drv = 0;
    cudaDriverGetVersion(&drv);
    const int N = 1 << 20;
    float *a, *b, *h = (float *)malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) h[i] = 1.0f;
    cudaMalloc(&a, N * sizeof(float));
    cudaMalloc(&b, N * sizeof(float));
    cudaMemcpy(a, h, N * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(b, h, N * sizeof(float), cudaMemcpyHostToDevice);
    add<<<(N + 255) / 256, 256>>>(N, a, b);
    cudaMemcpy(h, b, N * sizeof(float), cudaMemcpyDeviceToHost);
    int ok = cudaGetLastError() == cudaSuccess;
    for (int i = 0; ok && i < N; i++) ok = h[i] == 2.0f;
    char line[1024], lib[1024] = "?";
    FILE *f = fopen("/proc/self/maps", "r");
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, "/libcuda.so")) { char *s = strchr(line, '/'); s[strcspn(s, "\n")] = 0;
                                           strcpy(lib, s); break; }
    printf("cuda devices=%d name='%s' cc=%d.%d driver_cuda=%d kernel=%s libcuda=%s\n", n, p.name, p.major,
           p.minor, drv, ok ? "ok" : "FAILED", lib);
    return ok ? 0 : 1;
}
"""
NAMESPACE = r"""
set -e
R=$1; W=$2
for d in opt/nvidia usr/libexec/nodeprep run/cdi; do  # the node's paths, bound over the machine's
  if [ ! -d "/$d" ]; then  # its parent made writable here first (an overlay), for the mount point
    p=$(dirname "/$d"); n=$(echo "$p" | tr / _)
    mkdir -p "$W/ns/$n-up" "$W/ns/$n-work"
    mount -t overlay overlay -o "lowerdir=$p,upperdir=$W/ns/$n-up,workdir=$W/ns/$n-work" "$p"
    mkdir "/$d"
  fi
done
mount --bind "$R/opt/nvidia" /opt/nvidia
mount --bind "$R/usr/libexec/nodeprep" /usr/libexec/nodeprep
mount --bind "$W/cdi" /run/cdi
: > "$W/ns/ready"
exec sleep infinity
"""


class Check:
    def __init__(self) -> None:
        self.failed = 0

    def line(self, ok: bool | None, message: str) -> None:
        self.failed += ok is False
        word = "WARN" if ok is None else "OK" if ok else "FAIL"
        print(f"gpu-check: containers {word:<4} {message}", flush=True)


def sh(argv: list[object], timeout: float = 120) -> runner.Result:
    """argv's result (stdout, stderr, exit status), never raising for a non-zero exit."""
    return runner.run(argv, check=False, timeout=timeout, inherit_env=True)  # type: ignore[arg-type]


def make_rootfs(work: Path) -> Path:
    """This machine's sh, ldconfig and glibc plus the CUDA program (nvcc, sm_90, static cudart)."""
    rootfs = work / "rootfs"
    src = work / "cudacheck.cu"
    src.write_text(CUDA_PROGRAM)
    r = sh(["nvcc", "-O2", "-arch=sm_90", "-cudart", "static", "-o", work / "cudacheck", src], timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"gpu-check: containers: nvcc failed: {r.stderr.strip()[-500:]}")
    copy_into(rootfs, work / "cudacheck", "/usr/bin/cudacheck")
    copy_into(rootfs, Path(shutil.which("sh") or "/bin/sh"), "/bin/sh")
    ldconfig = Path("/sbin/ldconfig.real") if Path("/sbin/ldconfig.real").exists() else Path("/sbin/ldconfig")
    copy_into(rootfs, ldconfig, "/sbin/ldconfig")
    for d in ("proc", "sys", "dev", "tmp", "etc", "usr/lib/x86_64-linux-gnu", "usr/lib64"):
        (rootfs / d).mkdir(parents=True, exist_ok=True)
    for name in GLIBC:  # what the driver's libraries link besides the program's own (libpthread, ...)
        dirs = (Path("/lib/x86_64-linux-gnu"), Path("/usr/lib/x86_64-linux-gnu"))
        found = next((d / name for d in dirs if (d / name).exists()), None)
        if found and not (rootfs / "lib/x86_64-linux-gnu" / name).exists():
            shutil.copy2(os.path.realpath(found), rootfs / "lib/x86_64-linux-gnu" / name)
    (rootfs / "etc/ld.so.conf.d").mkdir()
    (rootfs / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")  # as distributions have
    sh(["ldconfig", "-r", rootfs])
    return rootfs


class Namespace:
    def __init__(self, node: Path, work: Path) -> None:
        self.work = work
        (work / "ns").mkdir()
        self.holder = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", NAMESPACE,
                                        "sh", node, work], stdout=subprocess.DEVNULL,
                                       stderr=open(work / "ns/log", "wb"), start_new_session=True)
        for _ in range(200):
            if (work / "ns/ready").exists():
                break
            if self.holder.poll() is not None:
                raise SystemExit(f"gpu-check: containers: namespace: {(work / 'ns/log').read_text()[-500:]}")
            time.sleep(0.05)
        # podman refuses a --runroot longer than 50 characters
        self.runroot = Path(tempfile.mkdtemp(prefix="np-podman.", dir="/tmp"))

    def podman(self, *args: object, hooks: Path, timeout: float = 120) -> runner.Result:
        p = self.work / "podman"
        base = ["nsenter", "-t", str(self.holder.pid), "-m", "podman", "--root", p / "root", "--runroot",
                self.runroot, "--tmpdir", p / "tmp", "--storage-driver", "vfs", "--cgroup-manager",
                "cgroupfs", "--events-backend", "none", "--hooks-dir", hooks]
        return sh([*base, *args], timeout=timeout)

    def close(self) -> None:
        self.holder.kill()
        self.holder.wait()
        shutil.rmtree(self.runroot, ignore_errors=True)


def claim_mounts(spec: dict) -> list[dict]:  # type: ignore[type-arg]
    """A DRA claim's mounts for the libraries nodeprep's spec links: each file mounted by name into
    the multiarch directory (a claim's spec runs no hook of nodeprep's)."""
    folder, links = cdi.library_links(spec)
    return [{"hostPath": f"{folder}/{entry}", "containerPath": f"/usr/lib/x86_64-linux-gnu/{name}",
             "options": list(cdi.MOUNT_OPTIONS)} for name, entry in sorted(links.items())]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--driver", required=True)
    ap.add_argument("--nvidia-bin", type=Path, help="NVIDIA's binaries, decompressed (ctk, cdi-hook)")
    ap.add_argument("--runs", type=int, default=21)
    args = ap.parse_args()
    check = Check()
    work = args.work / "containers"
    work.mkdir()
    node = args.work / "ctr" / "host"
    missing = [t for t in ("podman", "nvcc", "unshare", "nsenter") if not shutil.which(t)]
    if missing or not Path("/usr/bin/python3").is_file():
        check.line(False, f"needs {', '.join(missing) or '/usr/bin/python3 (the hook program runs with it)'}")
        return 1
    # the node: hook program, hooks.d file (in a dir of its own, as --hooks-dir), facts, specs
    (node / "usr/libexec/nodeprep").mkdir(parents=True, exist_ok=True)
    apply_changes(hook_program(node))  # the modules file, then the program
    gate_dir, no_hooks = work / "hooks.d", work / "no-hooks.d"
    gate_dir.mkdir()
    no_hooks.mkdir()
    (gate_dir / ocihooks.HOOK_NAME).write_bytes(ocihooks.render_hooks_d())
    warnings: list[str] = []  # the gate's facts as activation records them (nodeprep.node.gpufacts)
    live = gpufacts.gather(Layout(Path("/")), warnings)
    if live is None or not gpufacts.write(Layout(node), live):
        check.line(False, f"no GPU facts recorded: {'; '.join(warnings)}")
        return 1
    facts = json.loads(gpufacts.path(Layout(node)).read_text())
    check.line(None, f"facts recorded by nodeprep.node.gpufacts ({facts['source']}): "
               f"{json.dumps(facts['gpus'])}")
    gpus = gpumod.discover(Path("/"))
    loaded = tuple(m for m in Driver(version=args.driver).modules
                   if Path("/sys/module", m.replace("-", "_")).is_dir())
    spec = cdi.build_spec(node, Driver(version=args.driver, modules=loaded), gpus, version=args.driver,
                          dev_root=Path("/"))
    (work / "cdi").mkdir()
    (work / "cdi/nvidia.yaml").write_bytes(cdi.render_spec(spec))
    uuid = next((d["name"] for d in spec["devices"] if d["name"].startswith("GPU-")), None)
    gpu_nodes = [n for d in spec["devices"] if d["name"] == "0" for n in d["containerEdits"]["deviceNodes"]]
    claim = {"cdiVersion": "0.5.0", "kind": DRA_KIND, "devices": [{"name": CLAIM_UID, "containerEdits": {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": gpu_nodes + spec["containerEdits"]["deviceNodes"]}}],
        "containerEdits": {"mounts": claim_mounts(spec)}}
    (work / "cdi" / f"k8s.gpu.nvidia.com-claim_{CLAIM_UID}.json").write_text(json.dumps(claim))
    dra = f"{DRA_KIND}={CLAIM_UID}"
    variants = {"none": (None, no_hooks), "none+gate": (None, gate_dir),
                "nodeprep": ("nvidia.com/gpu=0", no_hooks), "nodeprep+gate": ("nvidia.com/gpu=0", gate_dir),
                "dra": (dra, no_hooks), "dra+gate": (dra, gate_dir)}
    ctk = args.nvidia_bin / "nvidia-ctk" if args.nvidia_bin else None
    if ctk and ctk.is_file():
        r = sh([ctk, "cdi", "generate", "--driver-root", "/", "--class", "ctkgpu", "--nvidia-cdi-hook-path",
                args.nvidia_bin / "nvidia-cdi-hook", "--output", work / "cdi/ctkgpu.yaml"], timeout=120)
        if r.returncode == 0:
            variants["nvidia"] = ("nvidia.com/ctkgpu=0", no_hooks)
        else:
            check.line(False, f"nvidia-ctk cdi generate: {r.stderr.strip()[-300:]}")
    base = make_rootfs(work)
    ns = Namespace(node, work)
    try:
        rootfs = {}
        for name in [*variants, "checks"]:  # NVIDIA's update-ldcache rewrites an image's cache: one each
            rootfs[name] = work / f"rootfs-{name}"
            shutil.copytree(base, rootfs[name], symlinks=True)

        def start(device: str | None, hooks: Path, fs: Path, *cmd: str, env: dict[str, str] | None = None
                  ) -> runner.Result:
            argv: list[object] = ["run", "--rm", *SANDBOX, *(["--device", device] if device else [])]
            for k, v in (env or {}).items():
                argv += ["--env", f"{k}={v}"]
            return ns.podman(*argv, "--rootfs", fs, *cmd, hooks=hooks)

        fs = rootfs["checks"]
        for label, device in (("by index", "nvidia.com/gpu=0"), ("by UUID", f"nvidia.com/gpu={uuid}"),
                              ("DRA claim", dra)):
            r = start(device, gate_dir, fs, "/usr/bin/cudacheck")
            check.line(r.returncode == 0 and "kernel=ok" in r.stdout,
                       f"nodeprep's spec {label}: {(r.stdout.strip() or r.stderr.strip())[-400:]}")
        r = start("nvidia.com/gpu=0", gate_dir, fs, "/usr/bin/nvidia-smi", "-L")
        said = (r.stdout or r.stderr).strip()[-300:]
        check.line(r.returncode == 0 and "GPU 0" in r.stdout, f"nvidia-smi -L: {said}")
        have = (sh(["nvidia-smi"]).stdout.split("CUDA Version:")[1:] or ["99.0"])[0].split()[0]
        major, minor = (int(x) for x in have.split(".")[:2])
        newer = f"cuda>={major}.{minor + 1}"
        for label, device in (("nodeprep's spec", "nvidia.com/gpu=0"), ("DRA claim", dra)):
            refused = start(device, gate_dir, fs, "/usr/bin/cudacheck", env={"NVIDIA_REQUIRE_CUDA": newer})
            said = [x for x in refused.stderr.splitlines() if "nodeprep: container refused:" in x]
            why = said[0].split("refused:", 1)[1].strip()[:200] if said else refused.stderr.strip()[-300:]
            check.line(refused.returncode != 0 and len(said) == 1 and "kernel=ok" not in refused.stdout,
                       f"{label}, NVIDIA_REQUIRE_CUDA={newer} (driver's CUDA {have}): refused: {why}")
            allowed = start(device, gate_dir, fs, "/usr/bin/cudacheck",
                            env={"NVIDIA_REQUIRE_CUDA": f"cuda>={have},brand={facts['gpus'][0]['brand']}"})
            check.line(allowed.returncode == 0 and "kernel=ok" in allowed.stdout,
                       f"{label}, cuda>={have},brand={facts['gpus'][0]['brand']}: allowed "
                       f"({'ran' if 'kernel=ok' in allowed.stdout else allowed.stderr.strip()[-200:]})")
            bypass = start(device, gate_dir, fs, "/usr/bin/cudacheck",
                           env={"NVIDIA_REQUIRE_CUDA": newer, "NVIDIA_DISABLE_REQUIRE": "1"})
            check.line(bypass.returncode == 0 and "kernel=ok" in bypass.stdout,
                       f"{label}, {newer} with NVIDIA_DISABLE_REQUIRE=1: bypassed")
        if "nvidia" in variants:
            r = start("nvidia.com/ctkgpu=0", no_hooks, rootfs["nvidia"], "/usr/bin/cudacheck")
            said = (r.stdout or r.stderr).strip()[-300:]
            check.line(r.returncode == 0 and "kernel=ok" in r.stdout, f"NVIDIA's spec, its hooks: {said}")
            r = start("nvidia.com/ctkgpu=0", no_hooks, rootfs["nvidia"], "/usr/bin/cudacheck",
                      env={"NVIDIA_REQUIRE_CUDA": newer})
            check.line(None, f"NVIDIA's spec with NVIDIA_REQUIRE_CUDA={newer}: "
                       f"{'started (not checked in CDI mode)' if r.returncode == 0 else 'refused'}")
        times: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(args.runs):
            for v, (device, hooks) in variants.items():
                t = time.monotonic()
                r = start(device, hooks, rootfs[v], "/bin/sh", "-c", ":")
                if r.returncode != 0:
                    check.line(False, f"timing start {v}: {r.stderr.strip()[-300:]}")
                    return 1
                times[v].append(time.monotonic() - t)
        med = {v: statistics.median(ts) for v, ts in times.items()}
        lines = [f"{v} {med[v] * 1000:.0f} ms (+{(med[v] - med['none']) * 1000:.0f})" for v in variants]
        check.line(None, f"median of {args.runs} interleaved starts: " + "; ".join(lines))
        added = {v: med[v] - med["none"] for v in med}
        gate_gpu = med["dra+gate"] - med["dra"]
        gate_plain = med["none+gate"] - med["none"]
        check.line(gate_gpu <= 0.050 and gate_plain <= 0.050,
                   f"the gate adds {gate_gpu * 1000:.0f} ms to a GPU start, {gate_plain * 1000:.0f} ms to a "
                   "start without a GPU (goal <= 50 ms)")
        if "nvidia" in added:
            nvidia = added["nvidia"] if added["nvidia"] > 0 else float("nan")
            ratio, both = added["nodeprep"] / nvidia, added["nodeprep+gate"] / nvidia
            check.line(ratio <= 0.5 and gate_gpu / nvidia <= 0.5,
                       f"nodeprep's spec adds {ratio:.2f} and the gate {gate_gpu / nvidia:.2f} of what "
                       f"NVIDIA's spec adds (goal <= 0.5 each); spec and gate together {both:.2f}")
        (args.work / "container-times.json").write_text(json.dumps(times))
    finally:
        ns.close()
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
