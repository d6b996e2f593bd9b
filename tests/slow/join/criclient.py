"""containerd's CRI plugin driven the way kubelet drives it, for the container-runtime tests.

- The CRI client is grpcio with the subset of the CRI API in cri/runtime_v1_subset.proto (names and
  field numbers as in k8s.io/cri-api runtime/v1), compiled with grpcio-tools at test time.
- Images: an OCI image layout per container rootfs (one uncompressed layer: the rootfs as tar),
  written here and imported with `ctr -n k8s.io images import`; the Debian image also serves as the
  pod sandbox ("pause") image, so nothing is pulled from a registry.
- containerd (1.7 or 2.1, unpacked from Debian's .debs) runs inside the GPU node's mount namespace
  (gpunode.py) with `containerd config default` of its own version (root/state/socket moved into the
  temp dir, sandbox image set to the imported one) plus nodeprep's drop-in, bind-mounted over
  /etc/containerd there. Pods use the node's network namespace (no CNI needed). With `gate` the
  config root's dpkg status names that containerd's package version, so nodeprep writes the
  handlers' base spec carrying the CUDA gate from its data for that version, as on a node.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodeprep.profile import Runtime
from nodeprep.runtime import containerd as ctd
from nodeprep.runtime import ocihooks
from nodeprep.runtime.files import apply_changes

from .gpunode import GpuNode, run, unpacked_deb

PROTO_DIR = Path(__file__).resolve().parent / "cri"
IMAGE = "docker.io/nodeprep-test/rootfs"
# the containerd versions the CRI tests run: (the Debian release whose package it is, major.minor)
CONTAINERDS = [("debian-13", "1.7"), ("debian-sid", "2.1")]
CONTAINERD_IDS = [major_minor for _, major_minor in CONTAINERDS]


def cri_modules(out: Path) -> tuple[Any, Any]:
    """(messages, stubs) compiled from the proto subset into `out`."""
    from grpc_tools import protoc

    out.mkdir(parents=True, exist_ok=True)
    rc = protoc.main(["protoc", f"-I{PROTO_DIR}", f"--python_out={out}", f"--grpc_python_out={out}",
                      str(PROTO_DIR / "runtime_v1_subset.proto")])
    assert rc == 0, "protoc failed"
    sys.path.insert(0, str(out))
    messages = importlib.import_module("runtime_v1_subset_pb2")
    return messages, importlib.import_module("runtime_v1_subset_pb2_grpc")


def _blob(blobs: Path, data: bytes) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def oci_archive(rootfs: dict[str, Path], work: Path) -> Path:
    """An OCI image layout holding one image per rootfs (`IMAGE:<name>`), as a tar for ctr import."""
    layout = work / "oci"
    blobs = layout / "blobs/sha256"
    blobs.mkdir(parents=True)
    manifests = []
    for name, root in rootfs.items():
        layer = work / f"{name}.layer.tar"
        run(["tar", "--numeric-owner", "-C", root, "-cf", layer, "."], timeout=600)
        h = hashlib.sha256()
        with open(layer, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        digest = h.hexdigest()
        shutil.move(layer, blobs / digest)
        config = {
            "architecture": "amd64", "os": "linux",
            "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                       "Cmd": ["/bin/sleep", "infinity"]},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{digest}"]},
        }
        manifest = {
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       **_blob(blobs, json.dumps(config).encode())},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": f"sha256:{digest}",
                        "size": (blobs / digest).stat().st_size}],
        }
        desc = _blob(blobs, json.dumps(manifest).encode())
        manifests.append({"mediaType": "application/vnd.oci.image.manifest.v1+json", **desc,
                          "annotations": {"io.containerd.image.name": f"{IMAGE}:{name}",
                                          "org.opencontainers.image.ref.name": name}})
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": manifests}))
    archive = work / "images.tar"
    run(["tar", "-C", layout, "-cf", archive, "."], timeout=600)
    shutil.rmtree(layout)
    return archive


def containerd_bin(test_cache: Path, os_name: str) -> Path:
    return unpacked_deb(test_cache, "containerd", os_name=os_name) / "usr/bin"


@dataclass
class Containerd:
    """One containerd daemon in the GPU node's namespace, with a CRI client."""

    node: GpuNode
    bindir: Path
    work: Path
    pb: Any
    stubs: Any
    proc: subprocess.Popen[bytes] | None = None
    sandboxes: list[str] = field(default_factory=list)
    channel: Any = None
    runtime: Runtime = field(default_factory=Runtime)  # the profile section of nodeprep's drop-in
    env: dict[str, str] = field(default_factory=dict)  # more environment for containerd (its shims)
    gate: bool = False

    @property
    def sock(self) -> Path:
        return self.work / "run/containerd.sock"

    def start(self, images: Path) -> None:
        default = run([self.bindir / "containerd", "config", "default"]).stdout
        text = default
        for old, new in (("/var/lib/containerd", f"{self.work}/var"), ("/run/containerd", f"{self.work}/run"),
                         ("/opt/containerd", f"{self.work}/opt")):
            text = text.replace(old, new)
        for pause in ("registry.k8s.io/pause:3.8", "registry.k8s.io/pause:3.10"):
            text = text.replace(pause, f"{IMAGE}:debian")
        # This CI sandbox forbids lowering oom_score_adj (runc init dies on the pod sandbox's -998):
        # containerd's own switch keeps it at containerd's value instead.
        text = text.replace("restrict_oom_score_adj = false", "restrict_oom_score_adj = true")
        root = self.work / "root"
        (root / "etc/containerd").mkdir(parents=True)
        (root / "etc/containerd/config.toml").write_text(text)
        hook = None
        if self.gate:  # the node's containerd version, as its dpkg status names it (nodeprep's data)
            version = self.bindir.parent.parent.name.split("_")[1]  # containerd_<version>_amd64
            (root / "var/lib/dpkg").mkdir(parents=True)
            (root / "var/lib/dpkg/status").write_text(
                f"Package: containerd\nStatus: install ok installed\nVersion: {version}\n")
            hook = ocihooks.gate_hook()
        # nodeprep's drop-in: enable_cdi, nvidia (+ the base spec with the gate)
        apply_changes(ctd.plan_containerd(root, self.runtime, gate_hook=hook))
        self.node.ns(["mount", "--bind", root / "etc/containerd", "/etc/containerd"])
        self.proc = self.node.spawn([self.bindir / "containerd", "--config", "/etc/containerd/config.toml"],
                                    self.work / "containerd.log",
                                    env={"PATH": f"{self.bindir}:/usr/sbin:/usr/bin:/sbin:/bin", **self.env})
        for _ in range(300):
            if self.sock.exists():
                break
            time.sleep(0.1)
        ctr = [self.bindir / "ctr", "--address", self.sock, "-n", "k8s.io"]
        self.node.ns([*ctr, "images", "import", images], timeout=600)
        import grpc

        self.channel = grpc.insecure_channel(f"unix://{self.sock}")
        self.rt = self.stubs.RuntimeServiceStub(self.channel)

    def version(self) -> Any:
        return self.rt.Version(self.pb.VersionRequest(version="v1"), timeout=30)

    def sandbox_config(self, name: str) -> Any:
        pb = self.pb
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=f"uid-{name}", namespace="default"),
            log_directory=str(self.work / "pods" / name),
            linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=pb.NamespaceOption(network=pb.NODE, pid=pb.CONTAINER, ipc=pb.POD))),
        )

    def run_pod(self, name: str, handler: str = "") -> tuple[str, Any]:
        """A pod sandbox run by the runtime `handler` (the RuntimeClass's handler; "" the default)."""
        config = self.sandbox_config(name)
        (self.work / "pods" / name).mkdir(parents=True, exist_ok=True)
        request = self.pb.RunPodSandboxRequest(config=config, runtime_handler=handler)
        sid = self.rt.RunPodSandbox(request, timeout=120).pod_sandbox_id
        self.sandboxes.append(sid)
        return sid, config

    def run_container(
        self, sid: str, sconfig: Any, name: str, image: str, script: str,
        env: dict[str, str] | None = None, device: str | None = "nvidia.com/gpu=all",
    ) -> tuple[int, str]:
        """Create and start a container in the pod, wait for it to exit: (exit code, stdout). `device`
        None: no CDI device in the CRI request."""
        pb = self.pb
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name), image=pb.ImageSpec(image=f"{IMAGE}:{image}"),
            command=["sh", "-c", script], envs=[pb.KeyValue(key=k, value=v) for k, v in (env or {}).items()],
            log_path=f"{name}.log", CDI_devices=[pb.CDIDevice(name=device)] if device else [],
        )
        request = pb.CreateContainerRequest(pod_sandbox_id=sid, config=config, sandbox_config=sconfig)
        cid = self.rt.CreateContainer(request, timeout=120).container_id
        self.rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=120)
        for _ in range(600):
            status = self.rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid), timeout=30).status
            if status.state == pb.CONTAINER_EXITED:
                break
            time.sleep(0.1)
        log = (Path(sconfig.log_directory) / f"{name}.log").read_text()
        lines = [line.split(" ", 3) for line in log.splitlines()]
        out = "\n".join(p[3] if len(p) > 3 else "" for p in lines if len(p) > 2 and p[1] == "stdout")
        return status.exit_code, out

    def stop(self) -> None:
        """Remove the pods (their shims exit), stop containerd, kill any shim left of this daemon."""
        for sid in self.sandboxes:
            try:
                self.rt.StopPodSandbox(self.pb.StopPodSandboxRequest(pod_sandbox_id=sid), timeout=60)
                self.rt.RemovePodSandbox(self.pb.RemovePodSandboxRequest(pod_sandbox_id=sid), timeout=60)
            except Exception:  # noqa: BLE001 - teardown goes on
                pass
        if self.channel is not None:
            self.channel.close()
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        marker = str(self.sock).encode()
        for pid in os.listdir("/proc"):  # shims of this daemon name its socket in their argv
            if pid.isdigit():
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"containerd-shim" in cmdline and marker in cmdline:
                    os.kill(int(pid), signal.SIGKILL)
        self.node.ns(["umount", "/etc/containerd"], check=False)


@contextlib.contextmanager
def running_containerd(gpu_node: GpuNode, test_cache: Path, os_name: str, work: Path, images: Path,
                       gen: Path, **options: Any) -> Iterator[Containerd]:
    """containerd of `os_name`'s package (the CRI modules compiled into `gen`) started in `work` with
    the `images` archive imported, until the block ends; stopped also on failure."""
    pb, stubs = cri_modules(gen)
    daemon = Containerd(gpu_node, containerd_bin(test_cache, os_name), work, pb, stubs, **options)
    try:
        daemon.start(images)
        yield daemon
    finally:
        daemon.stop()
