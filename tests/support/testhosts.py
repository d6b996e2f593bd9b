"""Real SSH test hosts: a Debian 12 rootfs per host, chrooted into its own network namespace.

Each host is a copy of one cached mmdebstrap tarball on a tmpfs of its own (when memory allows), with
/proc and a private devpts mounted, an
`ip netns` of its own joined to the root namespace by a veth pair on a private /24 (10.231.N.0/24:
.1 on the root side, .2 inside), and sshd listening on the inner address with host keys made for this
run. `fleet()` creates them and always tears everything down again (processes whose root is a host's
rootfs are killed, mounts unmounted, namespaces and veths deleted, directories removed).

The rootfs builder is shared with other areas (a test rootfs): `debian_rootfs(cache, dest)`.

Why tmpfs: real nodes each have a disk; hosts unpacked side by side on this machine's one disk
share its journal, and four driver installs at once (300 MB written and fsynced each) then took 4x
one install on ext4 but 2.3x on per-host tmpfs with 2 cores - the shared disk, not Ansible, set the
fleet benchmark's 4-host time. The product code runs unchanged (fsync on tmpfs is simply cheap).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import shutil
import signal
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from nodeprep import runner
from nodeprep.builder.buildroot import mounts_under
from tests.support.fixtures import NVIDIA_SMI

log = logging.getLogger(__name__)

SUITE = "bookworm"
# What a node needs to run nodeprep and be managed by Ansible (all exist in bookworm).
HOST_PACKAGES = (
    "openssh-server",
    "python3",
    "python3-yaml",
    "python3-click",
    "python3-requests",
    "python3-zstandard",
    "python3-jinja2",
    "python3-jsonschema",
    "python3-tomli-w",
    "python3-apt",
    "kmod",
    "zstd",
)
SUBNET_PREFIX = "10.231"
# Each host's tmpfs may grow to this; only what is written uses memory (~0.7 GB after site.yml).
HOST_TMPFS_SIZE = "4g"
HOST_MEMORY_NEED = 1 << 30  # per host, plus a 2 GiB reserve, before tmpfs is used


def _mirror() -> str:
    from nodeprep.sources.debian import host_mirrors

    archive, _ = host_mirrors()
    mirror = os.environ.get("NODEPREP_DEBIAN_MIRROR") or archive
    if not mirror:
        raise RuntimeError("no Debian mirror: set NODEPREP_DEBIAN_MIRROR (the host's apt sources name none)")
    return mirror


def rootfs_tarball(cache: Path, extra_packages: Sequence[str] = ()) -> Path:
    """Build (once, cached by package set) a minbase Debian 12 rootfs tarball and return its path."""
    packages = sorted(set(HOST_PACKAGES) | set(extra_packages))
    key = hashlib.sha256(" ".join([SUITE, *packages]).encode()).hexdigest()[:16]
    out = cache / "rootfs" / f"debian-12-{key}.tar"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_suffix(".part.tar")
    mirror = _mirror()
    argv = [
        "mmdebstrap",
        "--variant=minbase",
        "--mode=root",
        "--format=tar",
        f"--include={','.join(packages)}",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        # host keys are made per run, never baked into the cached image
        '--customize-hook=rm -f "$1"/etc/ssh/ssh_host_*',
        SUITE,
        os.fspath(part),
        f"deb {mirror} {SUITE} main",
        f"deb {mirror} {SUITE}-updates main",
    ]
    log.info("building test rootfs %s", out.name)
    runner.run(argv, timeout=1800, inherit_env=True)
    part.rename(out)
    return out


def debian_rootfs(cache: Path, dest: Path, extra_packages: Sequence[str] = ()) -> Path:
    """Unpack a Debian 12 rootfs (cached tarball under `cache`) into `dest` and return `dest`."""
    tarball = rootfs_tarball(cache, extra_packages)
    dest.mkdir(parents=True, exist_ok=True)
    runner.run(["tar", "-xpf", tarball, "-C", dest, "--numeric-owner"], timeout=600)
    return dest


@dataclass(frozen=True)
class TestHost:
    """One running host: its name, address, rootfs and namespace."""

    name: str
    index: int
    address: str
    gateway: str
    root: Path
    netns: str
    veth: str

    __test__ = False  # not a pytest test class


@dataclass(frozen=True)
class Fleet:
    """The hosts of one run and the client side: key, known_hosts, a HOME for ansible."""

    hosts: tuple[TestHost, ...]
    key: Path
    home: Path
    known_hosts: Path
    workdir: Path

    def by_name(self, name: str) -> TestHost:
        return next(h for h in self.hosts if h.name == name)


def _used_subnets() -> set[int]:
    out = runner.run(["ip", "-o", "-4", "addr", "show"]).stdout
    used = set()
    for line in out.splitlines():
        for word in line.split():
            if word.startswith(SUBNET_PREFIX + "."):
                used.add(int(word.split(".")[2]))
    return used


def _free_subnets(count: int) -> list[int]:
    used = _used_subnets()
    free = [n for n in range(10, 250) if n not in used]
    start = secrets.randbelow(max(1, len(free) - count))
    return free[start : start + count]


def _pids_rooted_at(root: Path) -> list[int]:
    target = os.fspath(root.resolve())
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if os.readlink(entry / "root") == target:
                pids.append(int(entry.name))
    return pids


def _kill_rooted(root: Path) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _pids_rooted_at(root)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        for _ in range(50):
            if not _pids_rooted_at(root):
                return
            time.sleep(0.1)


def _ssh_keygen(path: Path, comment: str) -> None:
    runner.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path])


SSHD_CONFIG = """\
ListenAddress {address}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
HostKey /etc/ssh/ssh_host_ed25519_key
PidFile /run/sshd.pid
AcceptEnv LANG LC_*
Subsystem sftp /usr/lib/openssh/sftp-server
MaxSessions 50
MaxStartups 50:30:100
"""


def _memory_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def use_tmpfs(count: int) -> bool:
    """Whether `count` hosts fit in memory on tmpfs roots (NODEPREP_TEST_HOST_TMPFS=0 turns it off)."""
    if os.environ.get("NODEPREP_TEST_HOST_TMPFS", "1") == "0":
        return False
    return _memory_available() > (2 << 30) + count * HOST_MEMORY_NEED


def _setup_host(host: TestHost, tarball: Path, client_pub: str, tmpfs: bool) -> str:
    """Unpack, mount, network and start sshd; return the host's public key line."""
    root = host.root
    root.mkdir(parents=True)
    if tmpfs:
        runner.run(["mount", "-t", "tmpfs", "-o", f"size={HOST_TMPFS_SIZE},mode=0755", "tmpfs", root])
    runner.run(["tar", "-xpf", tarball, "-C", root, "--numeric-owner"], timeout=600)
    runner.run(["mount", "-t", "proc", "proc", root / "proc"])
    (root / "dev/pts").mkdir(exist_ok=True)
    runner.run(
        ["mount", "-t", "devpts", "-o", "newinstance,ptmxmode=0666,mode=620", "devpts", root / "dev/pts"]
    )
    ptmx = root / "dev/ptmx"
    if ptmx.exists() or ptmx.is_symlink():
        ptmx.unlink()
    ptmx.symlink_to("pts/ptmx")
    (root / "etc/hostname").write_text(host.name + "\n")
    (root / "etc/hosts").write_text(f"127.0.0.1 localhost\n{host.address} {host.name}\n")
    (root / "run/sshd").mkdir(parents=True, exist_ok=True)
    _ssh_keygen(root / "etc/ssh/ssh_host_ed25519_key", f"root@{host.name}")
    (root / "etc/ssh/sshd_config").write_text(SSHD_CONFIG.format(address=host.address))
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(client_pub)
    os.chmod(ssh_dir / "authorized_keys", 0o600)

    join_network(host.netns, host.veth, host.gateway, host.address)
    ns = ["ip", "netns", "exec", host.netns]
    runner.run([*ns, "chroot", root, "/usr/sbin/sshd", "-f", "/etc/ssh/sshd_config"], timeout=30)
    pub = (root / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()
    return f"{host.address} {pub[0]} {pub[1]}\n"


def join_network(netns: str, veth: str, gateway: str, address: str) -> None:
    """A new network namespace `netns` joined to this one by a veth pair: `gateway`/24 on this side
    (`veth`), `address`/24 inside with loopback up and the default route via `gateway`. Removed by
    teardown_host (`ip netns del`, `ip link del`)."""
    runner.run(["ip", "netns", "add", netns])
    peer = veth[:-1] + "n"
    runner.run(["ip", "link", "add", veth, "type", "veth", "peer", "name", peer])
    runner.run(["ip", "link", "set", peer, "netns", netns])
    runner.run(["ip", "addr", "add", f"{gateway}/24", "dev", veth])
    runner.run(["ip", "link", "set", veth, "up"])
    ns = ["ip", "netns", "exec", netns]
    runner.run([*ns, "ip", "link", "set", "lo", "up"])
    runner.run([*ns, "ip", "addr", "add", f"{address}/24", "dev", peer])
    runner.run([*ns, "ip", "link", "set", peer, "up"])
    runner.run([*ns, "ip", "route", "add", "default", "via", gateway])


def teardown_host(host: TestHost) -> None:
    """Stop everything a host runs and remove it; safe on a half-created host."""
    if host.root.exists():
        _kill_rooted(host.root)
        for point in mounts_under(host.root):
            runner.run(["umount", "-l", point], check=False)
        if os.path.ismount(host.root):  # the host's own tmpfs, last
            runner.run(["umount", "-l", host.root], check=False)
    runner.run(["ip", "netns", "del", host.netns], check=False, timeout=30)
    runner.run(["ip", "link", "del", host.veth], check=False, timeout=30)
    if host.root.exists():
        if mounts_under(host.root) or os.path.ismount(host.root):
            raise RuntimeError(f"{host.root} still has mounts; not removing it")
        shutil.rmtree(host.root, ignore_errors=True)


def _wait_for_ssh(fleet: Fleet, host: TestHost, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    argv = [
        "ssh",
        "-i",
        fleet.key,
        "-o",
        f"UserKnownHostsFile={fleet.known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=3",
        f"root@{host.address}",
        "true",
    ]
    while True:
        r = runner.run(argv, check=False, timeout=15)
        if r.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{host.name}: sshd on {host.address} not reachable: {r.stderr.strip()}")
        time.sleep(0.3)


@contextlib.contextmanager
def fleet(
    cache: Path,
    workdir: Path,
    count: int,
    *,
    names: Sequence[str] | None = None,
    extra_packages: Sequence[str] = (),
) -> Iterator[Fleet]:
    """Start `count` SSH test hosts under `workdir`; tear them all down on exit, failure included."""
    tarball = rootfs_tarball(cache, extra_packages)
    run_id = secrets.token_hex(2)
    home = workdir / "home"
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    key = home / ".ssh" / "id_ed25519"
    _ssh_keygen(key, "nodeprep-tests")
    client_pub = key.with_suffix(".pub").read_text()
    known_hosts = home / ".ssh" / "known_hosts"
    subnets = _free_subnets(count)
    hosts = tuple(
        TestHost(
            name=(names[i] if names else f"node{i + 1}"),
            index=i,
            address=f"{SUBNET_PREFIX}.{n}.2",
            gateway=f"{SUBNET_PREFIX}.{n}.1",
            root=workdir / "hosts" / f"h{i}",
            netns=f"np-{run_id}-{i}",
            veth=f"np{run_id}{i}h",
        )
        for i, n in enumerate(subnets)
    )
    made: list[TestHost] = []
    tmpfs = use_tmpfs(count)
    log.info("test hosts: %d, roots on %s", count, "tmpfs" if tmpfs else "the disk")
    try:
        lines = []
        for host in hosts:
            made.append(host)
            lines.append(_setup_host(host, tarball, client_pub, tmpfs))
        known_hosts.write_text("".join(lines))
        fl = Fleet(hosts=hosts, key=key, home=home, known_hosts=known_hosts, workdir=workdir)
        for host in hosts:
            _wait_for_ssh(fl, host)
        yield fl
    finally:
        errors = []
        for host in made:
            try:
                teardown_host(host)
            except Exception as e:  # keep tearing down the others
                errors.append(f"{host.name}: {e}")
        if errors:
            raise RuntimeError("test host teardown: " + "; ".join(errors))


def inventory_yaml(
    fl: Fleet,
    *,
    groups: dict[str, Sequence[str]] | None = None,
    host_vars: dict[str, dict[str, object]] | None = None,
    group_vars: dict[str, object] | None = None,
) -> dict[str, object]:
    """An Ansible inventory (as a dict, dump it with yaml) addressing the hosts of `fl`."""
    hosts = {
        h.name: {
            "ansible_host": h.address,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": os.fspath(fl.key),
            "ansible_python_interpreter": "/usr/bin/python3",
            **(host_vars or {}).get(h.name, {}),
        }
        for h in fl.hosts
    }
    children = {g: {"hosts": {n: {} for n in members}} for g, members in (groups or {}).items()}
    return {"all": {"hosts": hosts, "children": children, "vars": dict(group_vars or {})}}


# --- running ansible-playbook against a fleet ---------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
RECAP_FIELDS = ("ok", "changed", "unreachable", "failed", "skipped", "rescued", "ignored")


def parse_recap(output: str) -> dict[str, dict[str, int]]:
    """The PLAY RECAP of ansible-playbook's default output as {host: {ok: N, changed: N, ...}}."""
    recap: dict[str, dict[str, int]] = {}
    lines = output.splitlines()
    try:
        start = max(i for i, line in enumerate(lines) if line.startswith("PLAY RECAP"))
    except ValueError:
        return recap
    for line in lines[start + 1 :]:
        if " : " not in line:
            if recap:
                break
            continue
        host, _, counts = line.partition(" : ")
        fields = dict(item.split("=", 1) for item in counts.split() if "=" in item)
        recap[host.strip()] = {k: int(fields[k]) for k in RECAP_FIELDS if k in fields}
    return recap


@dataclass(frozen=True)
class PlaybookRun:
    returncode: int
    output: str
    recap: dict[str, dict[str, int]]

    def changed_tasks(self) -> list[str]:
        """`[host] => task` for every task reported changed (from the default callback's output)."""
        found, task = [], ""
        for line in self.output.splitlines():
            if line.startswith("TASK ["):
                task = line[6 : line.rfind("]")]
            elif line.startswith("changed: ["):
                found.append(f"{line[9 : line.index(']')]}] => {task}")
        return found


def ansible_playbook(
    fl: Fleet,
    playbook: str | Path,
    inventory: Path,
    *,
    connection: str = "ssh",
    extra_vars: dict[str, object] | None = None,
    args: Sequence[str] = (),
    timeout: float = 1500,
) -> PlaybookRun:
    """Run ansible-playbook (this interpreter's ansible-core) from the repository root."""
    import json
    import sys

    cp_dir = fl.workdir / "cp"
    cp_dir.mkdir(exist_ok=True)
    argv: list[str | os.PathLike[str]] = [
        sys.executable,
        "-m",
        "ansible.cli.playbook",
        "-i",
        inventory,
        "-c",
        connection,
        "-e",
        json.dumps(extra_vars or {}),
        *args,
        REPO / playbook,
    ]
    env = {
        "HOME": os.fspath(fl.home),  # paramiko reads ~/.ssh/known_hosts from here
        "ANSIBLE_CONFIG": os.fspath(REPO / "ansible.cfg"),
        "ANSIBLE_HOME": os.fspath(fl.home / ".ansible"),
        "ANSIBLE_SSH_CONTROL_PATH_DIR": os.fspath(cp_dir),
        "ANSIBLE_SSH_COMMON_ARGS": f"-o UserKnownHostsFile={fl.known_hosts} -o StrictHostKeyChecking=yes",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_STDOUT_CALLBACK": "default",
        "ANSIBLE_DEPRECATION_WARNINGS": "0",
    }
    r = runner.run(argv, check=False, timeout=timeout, cwd=REPO, env=env, inherit_env=True)
    output = r.stdout + r.stderr
    return PlaybookRun(r.returncode, output, parse_recap(r.stdout))


# --- an artifact store served to the hosts over HTTP -------------------------------------------


@contextlib.contextmanager
def serve_directory(directory: Path, fl: Fleet) -> Iterator[dict[str, str]]:
    """Serve `directory` read-only over HTTP on each host's gateway address (the root-namespace end
    of its veth, nowhere else); yields {host name: base URL}. Stopped on exit."""
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            log.debug("store: " + format, *args)

        def copyfile(self, source, outputfile) -> None:  # type: ignore[no-untyped-def]
            # sendfile(2), like a real artifact server: hosts downloading at once would otherwise
            # queue on this process's GIL copying 64 KiB chunks through Python
            self.wfile.flush()
            self.connection.sendfile(source)

    handler = functools.partial(Quiet, directory=os.fspath(directory))
    servers, urls = [], {}
    try:
        for host in fl.hosts:
            server = http.server.ThreadingHTTPServer((host.gateway, 0), handler)
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, name=f"store-{host.name}", daemon=True).start()
            servers.append(server)
            urls[host.name] = f"http://{host.gateway}:{server.server_address[1]}"
        yield urls
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


# --- site.yml against test hosts (shared by tests/slow/fleet and bench/fleet.py) ----------------
# Stand-ins: GPU facts from a recorded nvidia-smi capture; the driver stack in an image root on each
# host (the hosts run the CI machine's kernel, which has no kmod artifact); kube_join in dry-run mode.

IMAGE_ROOT = "/srv/nodeprep-root"
GPU_CAPTURE = "a100-sxm4-80gb-mig_535.54.03.xml"
CA_PIN = "sha256:" + "5f" * 32
TOKEN = "abcdef.0123456789abcdef"


def prepare_host(host: TestHost) -> None:
    image = host.root / IMAGE_ROOT.lstrip("/")
    (image / "etc").mkdir(parents=True)
    shutil.copy(host.root / "etc/ld.so.conf", image / "etc/ld.so.conf")
    shutil.copy(host.root / "usr/lib/os-release", image / "etc/os-release")
    # the image's /usr/bin/python3 (Debian's link to python3.N), which runs nodeprep's hook program
    (image / "usr/bin").mkdir(parents=True)
    real = os.path.realpath(host.root / "usr/bin/python3")
    shutil.copy(real, image / "usr/bin" / os.path.basename(real))
    (image / "usr/bin/python3").symlink_to(os.path.basename(real))
    shutil.copy(NVIDIA_SMI / GPU_CAPTURE, host.root / "root/gpu.xml")


def fleet_vars(workdir: Path, source: Path, version: str, kernel: str) -> dict[str, object]:
    """Group variables for site.yml / upgrade-driver.yml against the test hosts."""
    profile = {
        "driver": {
            "version": "{{ nvidia_driver_version }}",
            "store": "{{ nvidia_driver_store }}",
            "insecure_http": True,  # serve_directory: plain http on each host's veth, off loopback
            "kernel": kernel,
        },
        "labels": {"cloud": "none", "extra": {"example.com/pool": "fleet-test"}},
        "cluster": {
            "api_server": "10.231.0.1:6443",
            "ca_cert_hashes": [CA_PIN],
            "kubernetes_version": "1.31",
            "node_name": "{{ inventory_hostname }}",
            "gpu_taint": True,
        },
        "runtime": {"cdi": True, "nvidia_runtime": True},
    }
    return {
        "nodeprep_install_source_dir": str(source),
        "nodeprep_install_controller_dir": str(workdir / "controller"),
        "nodeprep_install_root": IMAGE_ROOT,
        "nodeprep_install_profile": profile,
        "nvidia_driver_version": version,
        "nvidia_driver_root": IMAGE_ROOT,
        "nvidia_driver_kernel": kernel,
        "nvidia_driver_insecure_http": True,  # the same store, for the role
        "nvidia_driver_doctor_checks": ["state", "ldcache"],  # no GPU, no loaded module here
        "node_labels_root": IMAGE_ROOT,
        "node_labels_kernel": kernel,
        "node_labels_cloud": "none",  # never ask a metadata service from a test
        "node_labels_nvidia_smi_xml": "/root/gpu.xml",
        "node_labels_extra": {"example.com/pool": "fleet-test"},
        "container_runtime_root": IMAGE_ROOT,
        "container_runtime_nvidia_smi_xml": "/root/gpu.xml",
        "kube_join_root": IMAGE_ROOT,
        "kube_join_dry_run": True,
        "kube_join_token": TOKEN,
        "kube_join_nvidia_smi_xml": "/root/gpu.xml",
        "kube_join_skip_preflight": True,  # no kubeadm/kubelet/containerd service on the test hosts
    }


def write_inventory(
    fl: Fleet, path: Path, group_vars: dict[str, object], host_vars: dict[str, dict[str, object]]
) -> Path:
    inv = inventory_yaml(
        fl, groups={"gpu_nodes": [h.name for h in fl.hosts]}, host_vars=host_vars, group_vars=group_vars
    )
    path.write_text(yaml.safe_dump(inv, sort_keys=True))
    return path
