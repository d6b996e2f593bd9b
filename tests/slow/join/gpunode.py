"""A GPU node for real container runtimes, without a GPU: what is real and what stands in.

Real: the driver user space (the shared real 535.309.01 build, and Debian's tesla-535 535.216.03
built by the node tests' helpers), installed and activated by `nodeprep install/activate --root`
into a Debian 12 root; the CDI spec and containerd drop-in written by `nodeprep runtime --root`;
podman 4.3 (Debian 12), containerd 1.7 (trixie) and 2.1 (sid) unpacked from Debian's .debs fetched
through nodeprep's own archive access; container root filesystems made by mmdebstrap.

Stand-ins (there is no GPU): the device nodes /dev/nvidia0, /dev/nvidiactl, /dev/nvidia-modeset
(NVIDIA's major 195) and /dev/nvidia-uvm(-tools) (major 509, a typical dynamic major) are made with
mknod inside the test's own mount namespace, over an overlay of /dev; the GPU list comes from a
procfs file under the node root written in the driver's format (recorded from a Tesla T4).

The runtimes run in one private mount namespace per session (`unshare -m`) in which the node root's
/opt is bind-mounted over /opt, its /usr/libexec/nodeprep (the CDI hook program) at /usr/libexec/nodeprep
(over an overlay of /usr/libexec) and its /etc/cdi over /run/cdi (a tmpfs over /run hides the host's
/run, so no host daemon socket is ever used): the spec's hostPaths are the node's own paths
(/opt/nvidia/<version>/...), exactly as on a booted node, and the runtimes bind them from there.
Podman runs with --root/--tmpdir under the session's temp directory and --runroot in a short
directory of its own under /tmp (podman refuses one longer than 50 characters).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
GPU_UUID = "GPU-5a1b2c3d-0000-1111-2222-333344445555"
PROCFS_INFO = (  # /proc/driver/nvidia/gpus/<bus>/information of a Tesla T4 (recorded layout)
    "Model: \t\t Tesla T4\nIRQ:   \t\t 36\nGPU UUID: \t " + GPU_UUID + "\nVideo BIOS: \t 90.04.96.00.01\n"
    "Bus Type: \t PCIe\nDMA Size: \t 47 bits\nDMA Mask: \t 0x7fffffffffff\nBus Location: \t 0000:00:1e.0\n"
    "Device Minor: \t 0\nGPU Excluded:\t No\n"
)
STAND_IN_NODES = (  # path, major, minor
    ("/dev/nvidiactl", 195, 255),
    ("/dev/nvidia0", 195, 0),
    ("/dev/nvidia-modeset", 195, 254),
    ("/dev/nvidia-uvm", 509, 0),
    ("/dev/nvidia-uvm-tools", 509, 1),
)
NAMESPACE_SETUP = r"""
set -e
R=$1; W=$2; shift 2
mount --bind "$R/opt" /opt
mkdir -p "$W/olddev" "$W/devup" "$W/devwork"
mount --rbind /dev "$W/olddev"
mount -t overlay overlay -o "lowerdir=/dev,upperdir=$W/devup,workdir=$W/devwork" /dev
for m in pts shm mqueue; do
  if [ -d "$W/olddev/$m" ]; then mount --rbind "$W/olddev/$m" "/dev/$m"; fi
done
while [ $# -gt 0 ]; do mknod -m 666 "$1" c "$2" "$3"; shift 3; done
mount -t tmpfs tmpfs /run
mkdir /run/cdi
mount --bind "$R/etc/cdi" /run/cdi
if [ -d "$R/usr/libexec/nodeprep" ]; then  # the hook program the spec names, at the node's path
  mkdir -p "$W/libexecup/nodeprep" "$W/libexecwork"
  mount -t overlay overlay -o "lowerdir=/usr/libexec,upperdir=$W/libexecup,workdir=$W/libexecwork" \
    /usr/libexec
  mount --bind "$R/usr/libexec/nodeprep" /usr/libexec/nodeprep
fi
: > "$W/ready"
exec sleep infinity
"""
PROBE_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <sys/stat.h>
/* dlopen each library as an application would and print the file ld.so loaded: path dev:ino */
int main(int argc, char **argv) {
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        void *h = dlopen(argv[i], RTLD_LAZY);
        struct link_map *lm = NULL;
        struct stat st;
        if (!h || dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0 || stat(lm->l_name, &st) != 0) {
            printf("%s NOTFOUND\n", argv[i]);
            rc = 1;
            continue;
        }
        printf("%s %s %lu:%lu\n", argv[i], lm->l_name, (unsigned long)st.st_dev, (unsigned long)st.st_ino);
    }
    return rc;
}
"""
PODMAN_SANDBOX = [
    # This CI sandbox caps RLIMIT_NOFILE/NPROC below podman's defaults for containers (1048576),
    # which runc cannot raise: ask for limits inside the sandbox's.
    "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096",
]


def run(argv: list[object], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([os.fspath(a) for a in argv], check=True, capture_output=True, text=True,  # type: ignore[call-overload]
                          timeout=kw.pop("timeout", 600), **kw)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """A real `python -m nodeprep.cli` process."""
    env = {k: v for k, v in os.environ.items() if k != "NODEPREP_CRASH_AT"}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([os.sys.executable, "-m", "nodeprep.cli", *args], capture_output=True,  # type: ignore[attr-defined]
                          text=True, env=env, cwd=REPO, timeout=600)


def file_id(path: Path) -> str:
    st = path.stat()
    return f"{st.st_dev}:{st.st_ino}"


def make_rootfs_tar(cache: Path) -> Path:
    """Debian 12 `essential` rootfs (mmdebstrap), cached: the container image of both layouts."""
    tar = cache / "debian12-essential.tar"
    if not tar.exists():
        tmp = tar.with_suffix(".part.tar")
        run(["mmdebstrap", "--quiet", "--variant=essential", "bookworm", tmp], timeout=1800)
        tmp.rename(tar)
    return tar


def unpacked_deb(test_cache: Path, package: str, *, os_name: str = "debian-12", arch: str = "amd64",
                 security: bool = True) -> Path:
    """The newest .deb of `package` in `os_name`/`arch`, fetched through nodeprep's own archive
    access and unpacked once under the test cache (cdi/<deb name>)."""
    from nodeprep.sources.debian import DebianArchive

    deb = DebianArchive(test_cache, os_name=os_name, arch=arch, security=security).download(package)
    dest = test_cache / "cdi" / deb.stem
    if not (dest / ".done").exists():
        shutil.rmtree(dest, ignore_errors=True)
        DebianArchive.extract(deb, dest)
        (dest / ".done").touch()
    return dest


def unpack_rootfs(
    tar: Path, dest: Path, probe: Path, *, layout: str, lib64_glibc: Path | None = None
) -> Path:
    """A container rootfs: `debian` (multiarch, as built) or `lib64` standing for RHEL/UBI images.

    `lib64`: every shared library of /usr/lib/x86_64-linux-gnu moved to /usr/lib64 (/lib64 is a link
    to it), glibc replaced by a real glibc built for /lib64 (Debian's libc6-amd64, the same glibc
    2.36 source: unpacked from `lib64_glibc`, its loader at /usr/lib64/ld-linux-x86-64.so.2),
    ld.so.conf naming only /usr/lib64 and the ld.so.cache rebuilt from that. Its loader searches
    /etc/ld.so.cache, then /lib64, /usr/lib64, /lib, /usr/lib — not the Debian multiarch directory
    (`ld.so --help`, "system search path"), like a RHEL/UBI loader (/lib64, /usr/lib64), so a library
    found without an ld cache entry is found the way it would be on UBI."""
    dest.mkdir(parents=True)
    with tarfile.open(tar) as t:
        t.extractall(dest, filter="fully_trusted")
    shutil.copy(probe, dest / "usr/local/bin/probe")
    if layout == "lib64":
        assert lib64_glibc is not None
        multiarch, lib64 = dest / "usr/lib/x86_64-linux-gnu", dest / "usr/lib64"
        for p in sorted(multiarch.iterdir()):
            if ".so" in p.name and (p.is_symlink() or p.is_file()):
                (lib64 / p.name).unlink(missing_ok=True)
                p.rename(lib64 / p.name)  # links are relative to their own directory
        for p in sorted((lib64_glibc / "lib64").iterdir()):
            (lib64 / p.name).unlink(missing_ok=True)
            shutil.copy2(p, lib64 / p.name, follow_symlinks=False)
        for conf in (dest / "etc/ld.so.conf.d").glob("*.conf"):
            conf.unlink()
        (dest / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n/usr/lib64\n")
        run(["chroot", dest, "ldconfig"])
    return dest


@dataclass
class GpuNode:
    """The node root, the private mount namespace and podman's private storage."""

    root: Path
    work: Path
    pid: int = 0
    rootfs: dict[str, Path] = field(default_factory=dict)
    daemons: list[subprocess.Popen[bytes]] = field(default_factory=list)
    # podman refuses a --runroot longer than 50 characters, which a path under pytest's temporary
    # directory can be (/tmp/pytest-of-root/pytest-10008/gpunode0/...): its own short one under /tmp
    runroot: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="nodeprep-podman-")))

    # -- namespace -----------------------------------------------------------------------------
    def start(self) -> None:
        nodes = [str(x) for n in STAND_IN_NODES for x in n]
        holder = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", NAMESPACE_SETUP, "sh",
             str(self.root), str(self.work), *nodes],
            stdout=subprocess.DEVNULL, stderr=open(self.work / "namespace.log", "wb"),
            start_new_session=True,
        )
        self.daemons.append(holder)
        for _ in range(200):
            if (self.work / "ready").exists():
                break
            if holder.poll() is not None:
                raise RuntimeError((self.work / "namespace.log").read_text())
            time.sleep(0.05)
        self.pid = holder.pid

    def ns(self, argv: list[object], *, check: bool = True, timeout: float = 300,
           input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run argv inside the node's mount namespace."""
        return subprocess.run(
            ["nsenter", "-t", str(self.pid), "-m", *[os.fspath(a) for a in argv]],
            capture_output=True, text=True, timeout=timeout, check=check, input=input,
        )

    def spawn(
        self, argv: list[object], log: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """A daemon inside the namespace, stopped by `stop()`."""
        proc = subprocess.Popen(
            ["nsenter", "-t", str(self.pid), "-m", *[os.fspath(a) for a in argv]],
            stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        self.daemons.insert(0, proc)
        return proc

    def stop(self) -> None:
        """Remove every podman container, stop daemons (containerd) and the namespace holder."""
        if self.pid:
            self.ns(self.podman_base() + ["rm", "--force", "--all", "--time", "0"], check=False)
        for proc in self.daemons:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(timeout=20)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=20)
        shutil.rmtree(self.runroot, ignore_errors=True)

    # -- podman --------------------------------------------------------------------------------
    def podman_base(self) -> list[object]:
        p = self.work / "podman"
        return ["podman", "--root", p / "root", "--runroot", self.runroot, "--tmpdir", p / "tmp",
                "--cgroup-manager", "cgroupfs", "--events-backend", "none"]

    def podman_run(self, layout: str, script: str, *, device: str = "nvidia.com/gpu=all",
                   env: dict[str, str] | None = None, detach: bool = False,
                   name: str | None = None) -> subprocess.CompletedProcess[str]:
        argv: list[object] = [*self.podman_base(), "run", "--network", "none", *PODMAN_SANDBOX,
                              "--device", device]
        argv += ["--detach"] if detach else ["--rm"]
        argv += ["--name", name] if name else []
        for k, v in (env or {}).items():
            argv += ["--env", f"{k}={v}"]
        argv += ["--rootfs", self.rootfs[layout], "sh", "-c", script]
        return self.ns(argv, check=False)

    def podman_exec(self, name: str, script: str) -> subprocess.CompletedProcess[str]:
        return self.ns([*self.podman_base(), "exec", name, "sh", "-c", script], check=False)

    # -- NVIDIA's hook -------------------------------------------------------------------------
    @contextlib.contextmanager
    def nvidia_cdi_hook(self, binary: Path) -> Iterator[dict]:  # type: ignore[type-arg]
        """NVIDIA's real nvidia-cdi-hook installed on the node: at ROOT/usr/bin (where `nodeprep
        runtime --root` finds it) and, for the runtimes, at /usr/bin inside the namespace (an
        overlay of /usr/bin); yields the spec `nodeprep runtime` then writes, and rewrites it
        without the hook afterwards."""
        import yaml

        work = Path(tempfile.mkdtemp(prefix="nvidia-hook-", dir=self.work))
        (work / "up").mkdir()
        (work / "work").mkdir()
        shutil.copy(binary, work / "up/nvidia-cdi-hook")
        on_node = self.root / "usr/bin/nvidia-cdi-hook"
        shutil.copy(binary, on_node)
        mounted = False
        try:
            self.ns(["mount", "-t", "overlay", "overlay", "-o",
                     f"lowerdir=/usr/bin,upperdir={work}/up,workdir={work}/work", "/usr/bin"])
            mounted = True
            r = cli("runtime", "--root", str(self.root))
            assert r.returncode == 0, r.stderr
            yield yaml.safe_load((self.root / "etc/cdi/nvidia.yaml").read_text())
        finally:
            if mounted:  # lazily: a podman or shim process started meanwhile may still hold it
                self.ns(["umount", "--lazy", "/usr/bin"])
            on_node.unlink(missing_ok=True)
            r = cli("runtime", "--root", str(self.root))
            assert r.returncode == 0, r.stderr


INSPECT = (
    # what an application sees: device nodes, the ld cache, the files ld.so loads, nvidia-smi
    "for d in /dev/nvidia*; do echo \"node $d $(stat -c '%F %t:%T' $d)\"; done; "
    "ldconfig -p | sed -n 's/^\\t\\(lib[a-z-]*\\.so\\.1\\) .* => \\(.*\\)$/cache \\1 \\2/p'; "
    "probe libcuda.so.1 libnvidia-ml.so.1 | sed 's/^/probe /'; "
    # the source (root field) of each bind mount under /opt/nvidia (the driver's library folder)
    "sed -n 's|^[0-9]* [0-9]* [0-9:]* \\([^ ]*\\) /opt/nvidia/[^ ]* .*|mount \\1|p' "
    "/proc/self/mountinfo; "
    # where the names the loader finds lead (links made by nodeprep's hook)
    "for l in /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1; do "
    "[ -L $l ] && echo \"link $l $(readlink $l)\"; done; "
    "nvidia-smi >/dev/null 2>&1; echo \"smi $?\""
)


@dataclass(frozen=True)
class Seen:
    """What INSPECT printed inside a container."""

    nodes: dict[str, str]
    cache: dict[str, str]
    probe: dict[str, tuple[str, str]]
    mounts: list[str]
    smi: int
    links: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, out: str) -> Seen:
        nodes, cache, probe, mounts, smi, links = {}, {}, {}, [], -1, {}
        for line in out.splitlines():
            kind, _, rest = line.partition(" ")
            parts = rest.split()
            if kind == "node":
                nodes[parts[0]] = " ".join(parts[1:])
            elif kind == "cache":
                cache[parts[0]] = parts[1]
            elif kind == "probe" and len(parts) == 3:
                probe[parts[0]] = (parts[1], parts[2])
            elif kind == "mount":
                mounts.append(parts[0])
            elif kind == "smi":
                smi = int(parts[0])
            elif kind == "link" and len(parts) == 2:
                links[parts[0]] = parts[1]
        return cls(nodes, cache, probe, mounts, smi, links)
