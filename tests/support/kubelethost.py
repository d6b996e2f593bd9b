"""A Kubernetes node for tests: a Debian 12 rootfs with containerd 1.6, runc and the CNI plugins, in its
own network namespace, where the real kubelet (v1.24.0-alpha.3, from NODEPREP_K8S_BIN) runs chrooted.

Made like tests/support/testhosts.py hosts (cached mmdebstrap tarball on a tmpfs of its own, an `ip
netns` joined to the root namespace by a veth pair on 10.232.N.0/24) plus what a node needs: /sys and
/dev bound in (cgroups, /dev/kmsg), a tmpfs /run, containerd started from the rootfs's own
/etc/containerd (which `nodeprep join --root` edits), a bridge CNI configuration, and a pause image
built here (a static binary from a tiny C program, packed as an OCI image layout and imported with
`ctr images import`; nothing is pulled).

The control plane listens on 127.0.0.1 of the root namespace only. Inside the node's namespace a relay
listens on its own 127.0.0.1:PORT and forwards each connection to the API server (the listening socket
is made in the node's namespace, the outgoing ones in the test's), so the kubeconfigs that name
https://127.0.0.1:PORT work unchanged. Everything is torn down on exit, also on failure.
"""

from __future__ import annotations

import contextlib
import ctypes
import gzip
import hashlib
import io
import json
import os
import queue
import secrets
import shutil
import socket
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from nodeprep import runner
from tests.support import procs, testhosts

PACKAGES = ("containerd", "runc", "containernetworking-plugins", "iptables", "ca-certificates")
PAUSE_IMAGE = "nodeprep.test/pause:1"
SUBNET_PREFIX = "10.232"
CLONE_NEWNET = 0x40000000

PAUSE_C = r"""
#include <signal.h>
#include <unistd.h>
static void stop(int sig) { (void)sig; _exit(0); }
int main(void) {
    signal(SIGINT, stop);
    signal(SIGTERM, stop);
    for (;;) pause();
}
"""

KUBELET_UNIT = """\
[Unit]
Description=kubelet: The Kubernetes Node Agent
Wants=network-online.target
After=network-online.target

[Service]
ExecStart=/usr/bin/kubelet
Restart=always
RestartSec=10

[Install]
WantedBy=multi-user.target
"""

CNI_CONFLIST = {
    "cniVersion": "1.0.0",
    "name": "nodeprep-test",
    "plugins": [
        {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/16"}]],
                  "routes": [{"dst": "0.0.0.0/0"}]}},
        {"type": "portmap", "capabilities": {"portMappings": True}},
    ],
}


# --- pause image ---------------------------------------------------------------------------------------

def _tar_bytes(members: dict[str, tuple[bytes, int]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, (data, mode) in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def pause_image(cache: Path) -> Path:
    """An OCI image-layout tarball holding a static `/pause` (built once, cached by the C source)."""
    key = hashlib.sha256(PAUSE_C.encode()).hexdigest()[:16]
    out = cache / "k8s" / f"pause-{key}.oci.tar"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.parent / f".pause-{os.getpid()}"
    work.mkdir(exist_ok=True)
    try:
        (work / "pause.c").write_text(PAUSE_C)
        runner.run(["gcc", "-static", "-Os", "-s", "-o", work / "pause", work / "pause.c"], timeout=120)
        layer = _tar_bytes({"pause": ((work / "pause").read_bytes(), 0o755)})
        diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
        gz = gzip.compress(layer, mtime=0)
        config = json.dumps({
            "architecture": "amd64", "os": "linux",
            "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }).encode()
        blobs: dict[str, bytes] = {}

        def blob(data: bytes) -> str:
            digest = hashlib.sha256(data).hexdigest()
            blobs[f"blobs/sha256/{digest}"] = data
            return "sha256:" + digest

        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": blob(config), "size": len(config)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "digest": blob(gz), "size": len(gz)}],
        }).encode()
        index = json.dumps({"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": blob(manifest),
            "size": len(manifest), "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": PAUSE_IMAGE,
                            "org.opencontainers.image.ref.name": PAUSE_IMAGE.rsplit(":", 1)[1]}}]}).encode()
        members = {"oci-layout": (b'{"imageLayoutVersion":"1.0.0"}', 0o644), "index.json": (index, 0o644)}
        members.update({k: (v, 0o644) for k, v in blobs.items()})
        tmp = out.with_suffix(".part")
        tmp.write_bytes(_tar_bytes(members))
        tmp.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


# --- loopback relay into the node's namespace ---------------------------------------------------------

def _setns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


@dataclass
class Relay:
    """127.0.0.1:port inside `netns` -> 127.0.0.1:port of the test's namespace."""

    netns: str
    port: int
    stop: threading.Event = field(default_factory=threading.Event)
    conns: queue.Queue[socket.socket | None] = field(default_factory=queue.Queue)
    sockets: list[socket.socket] = field(default_factory=list)

    def start(self) -> None:
        ready = threading.Event()
        errors: list[BaseException] = []

        def listen() -> None:  # this thread moves into the node's namespace for good
            try:
                _setns(f"/run/netns/{self.netns}")
                srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                srv.bind(("127.0.0.1", self.port))
                srv.listen(64)
                srv.settimeout(0.2)
                self.sockets.append(srv)
            except BaseException as e:  # noqa: BLE001 - reported to the starting thread
                errors.append(e)
                ready.set()
                return
            ready.set()
            while not self.stop.is_set():
                try:
                    conn, _ = srv.accept()
                except (TimeoutError, OSError):
                    continue
                self.conns.put(conn)

        def dispatch() -> None:  # stays in the test's namespace: outgoing sockets are made here
            while True:
                conn = self.conns.get()
                if conn is None:
                    return
                try:
                    up = socket.create_connection(("127.0.0.1", self.port), timeout=5)
                except OSError:
                    conn.close()
                    continue
                up.settimeout(None)
                conn.settimeout(None)
                self.sockets += [conn, up]
                for a, b in ((conn, up), (up, conn)):
                    threading.Thread(target=_pump, args=(a, b), daemon=True).start()

        threading.Thread(target=listen, daemon=True).start()
        threading.Thread(target=dispatch, daemon=True).start()
        ready.wait(10)
        if errors:
            raise errors[0]

    def close(self) -> None:
        self.stop.set()
        self.conns.put(None)
        for s in self.sockets:
            with contextlib.suppress(OSError):
                s.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


# --- the node -----------------------------------------------------------------------------------------

@dataclass
class KubeletHost:
    name: str
    root: Path
    netns: str
    veth: str
    address: str
    gateway: str
    logs: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    relay: Relay | None = None

    def ns_argv(self, *argv: str | os.PathLike[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, "chroot", str(self.root), *map(str, argv)]

    def spawn(self, name: str, *argv: str) -> subprocess.Popen[bytes]:
        log = self.logs / f"{name}.log"
        with log.open("ab") as f:
            proc = subprocess.Popen(self.ns_argv(*argv), stdout=f, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs[name] = proc
        return proc

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        procs.terminate_group(proc)
        procs.wait_or_kill_group(proc, 15)

    def run(self, *argv: str, timeout: float = 60) -> runner.Result:
        return runner.run(self.ns_argv(*argv), timeout=timeout)

    def log_tail(self, name: str, lines: int = 60) -> str:
        p = self.logs / f"{name}.log"
        return "\n".join(p.read_text(errors="replace").splitlines()[-lines:]) if p.is_file() else ""

    def start_containerd(self) -> None:
        sock = self.root / "run/containerd/containerd.sock"
        self.spawn("containerd", "/usr/bin/containerd", "--config", "/etc/containerd/config.toml")
        deadline = time.monotonic() + 30
        while not sock.is_socket():
            if self.procs["containerd"].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("containerd did not start\n" + self.log_tail("containerd"))
            time.sleep(0.2)

    def import_image(self, tarball: Path) -> None:
        dest = self.root / "tmp" / tarball.name
        if tarball.resolve() != dest.resolve():
            shutil.copy(tarball, dest)
        self.run("/usr/bin/ctr", "--address", "/run/containerd/containerd.sock", "-n", "k8s.io", "images",
                 "import", "--platform", "linux/amd64", f"/tmp/{tarball.name}")


def containerd_main_config() -> str:
    """Debian's `containerd config default`, as an admin adapts it: the CNI plugins where Debian puts
    them, the locally built pause image."""
    text = runner.run(["containerd", "config", "default"]).stdout
    text = text.replace('bin_dir = "/opt/cni/bin"', 'bin_dir = "/usr/lib/cni"')
    text = text.replace('sandbox_image = "registry.k8s.io/pause:3.6"', f'sandbox_image = "{PAUSE_IMAGE}"')
    assert PAUSE_IMAGE in text and "/usr/lib/cni" in text
    return text


@contextlib.contextmanager
def kubelet_host(cache: Path, work: Path, kubelet: Path, api_port: int) -> Iterator[KubeletHost]:
    """A node rootfs with containerd configured by the caller's `nodeprep join --root` (call
    `host.start_containerd()` after it), /usr/bin/kubelet in place and the API relay running."""
    used = _used_subnets()
    index = next(n for n in range(10, 250) if n not in used)
    run_id = secrets.token_hex(2)
    host = KubeletHost(name=f"np-node-{run_id}", root=work / "node", netns=f"npk-{run_id}",
                       veth=f"npk{run_id}h", address=f"{SUBNET_PREFIX}.{index}.2",
                       gateway=f"{SUBNET_PREFIX}.{index}.1", logs=work / "logs")
    host.logs.mkdir(parents=True, exist_ok=True)
    tarball = testhosts.rootfs_tarball(cache, PACKAGES)
    image = pause_image(cache)
    root = host.root
    try:
        root.mkdir(parents=True)
        runner.run(["mount", "-t", "tmpfs", "-o", "size=3g,mode=0755", "tmpfs", root])
        runner.run(["tar", "-xpf", tarball, "-C", root, "--numeric-owner"], timeout=600)
        runner.run(["mount", "-t", "proc", "proc", root / "proc"])
        runner.run(["mount", "--rbind", "/sys", root / "sys"])
        runner.run(["mount", "--make-rslave", root / "sys"])
        runner.run(["mount", "--rbind", "/dev", root / "dev"])
        runner.run(["mount", "--make-rslave", root / "dev"])
        runner.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", root / "run"])
        shutil.copy(kubelet, root / "usr/bin/kubelet")
        (root / "usr/bin/kubelet").chmod(0o755)
        (root / "lib/systemd/system").mkdir(parents=True, exist_ok=True)
        (root / "lib/systemd/system/kubelet.service").write_text(KUBELET_UNIT)  # as the kubelet package has
        (root / "etc/hostname").write_text(host.name + "\n")
        (root / "etc/hosts").write_text(f"127.0.0.1 localhost\n{host.address} {host.name}\n")
        (root / "etc/containerd").mkdir(parents=True, exist_ok=True)
        (root / "etc/containerd/config.toml").write_text(containerd_main_config())
        (root / "etc/cni/net.d").mkdir(parents=True, exist_ok=True)
        (root / "etc/cni/net.d/10-nodeprep-test.conflist").write_text(json.dumps(CNI_CONFLIST, indent=1))
        shutil.copy(image, root / "tmp" / image.name)

        testhosts.join_network(host.netns, host.veth, host.gateway, host.address)
        host.relay = Relay(host.netns, api_port)
        host.relay.start()
        yield host
    finally:
        for name in list(host.procs)[::-1]:
            host.stop(name)
        if host.relay is not None:
            host.relay.close()
        testhosts.teardown_host(testhosts.TestHost(host.name, index, host.address, host.gateway, root,
                                                   host.netns, host.veth))
        # the kubelet's empty cgroups (rmdir removes only empty ones)
        for name in CGROUPS:
            for d in Path("/sys/fs/cgroup").glob(f"*/{name}"):
                _remove_cgroup_tree(d)


CGROUPS = ("kubepods", "kubepods.slice")


def _remove_cgroup_tree(d: Path) -> None:
    for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            sub.rmdir()
    with contextlib.suppress(OSError):
        d.rmdir()


def _used_subnets() -> set[int]:
    out = runner.run(["ip", "-o", "-4", "addr", "show"]).stdout
    return {int(w.split(".")[2]) for w in out.split() if w.startswith(SUBNET_PREFIX + ".")}
