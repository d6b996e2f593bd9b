"""playbooks/upgrade-driver.yml's reboot branch for real, against a qemu VM: Debian 12's real kernel
(the test cache's linux-image of the upgrade store's kernel release) boots a tiny busybox initramfs
that loads virtio_pci/virtio_blk/virtio_net/ext4 (modules in that kernel) and switch_roots into an
ext4 disk (`mkfs.ext4 -d`) holding an mmdebstrap rootfs with systemd, udev, sshd and python3, reached
by Ansible over user-mode networking (sshd forwarded to 127.0.0.1 only, an ephemeral key). Software
emulation (TCG): under the CI machine's nested KVM this kernel hangs before its first message (as
tests/slow/node/test_node_live.py found), with every -cpu model tried.

Run 1 installs the old version on the live root (`/`): upgrade_reload auto loads its modules in place.
Run 2 upgrades with `upgrade_reload: reboot`: Ansible's `reboot` reboots the VM, nodeprep-nvidia.service
loads the new version's modules at boot, then the doctor gate (state, ldcache, module, kmod) passes.
Run 3 goes back to the old version with `upgrade_reload: auto` while the new version's modules are
loaded and nothing holds them: they are unloaded and the old ones loaded in place, no reboot.

The modules are the kmod-shaped stand-ins of tests/slow/node/helpers.py (really compiled for that
kernel, MODULE_VERSION = the driver version): no GPU, nothing GPU-like, no NVML mock; the real NVIDIA
module would stop at its PCI probe here, so the test asserts the boot id changed, the reboot task's
result, `current` and the loaded module's version after the reboot, and the doctor's report.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from nodeprep.builder.initramfs import CpioEntry, load_order, parse_modules_dep, write_newc
from nodeprep.builder.kernelfetch import fetch_kernel
from nodeprep.sources.debian import DebianArchive
from tests.support import testhosts

from .conftest import Store, fleet_vars

pytestmark = pytest.mark.slow

VM_PACKAGES = ("systemd-sysv", "udev", "dbus", "iproute2")  # dbus: shutdown -r asks logind
BOOT_MODULES = ("crc32c_generic", "virtio_pci", "virtio_blk", "virtio_net", "ext4")
CHECKS = ["state", "ldcache", "module", "kmod"]
INIT = """#!/bin/busybox sh
B=/bin/busybox
$B mount -t proc proc /proc; $B mount -t sysfs sysfs /sys; $B mount -t devtmpfs dev /dev
for m in {modules}; do $B insmod /modules/$m.ko || echo "initramfs: insmod $m failed"; done
n=0; while [ ! -b /dev/vda ] && [ $n -lt 100 ]; do $B sleep 0.1; n=$((n+1)); done
$B mkdir -p /newroot; $B mount -t ext4 -o rw /dev/vda /newroot || $B poweroff -f
$B umount /proc /sys; $B mount --move /dev /newroot/dev
exec $B switch_root /newroot /sbin/init
"""
NETWORK = "[Match]\nType=ether\n\n[Network]\nDHCP=ipv4\n"
SSHD = "HostKey /etc/ssh/ssh_host_ed25519_key\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"


def _skip_reason(kernel_dir: Path) -> str | None:
    tools = ("qemu-system-x86_64", "mmdebstrap", "mkfs.ext4", "busybox", "ssh", "ssh-keygen")
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        return "the VM needs " + ", ".join(missing) + " (scripts/deps/fleet.apt, smoke.apt)"
    if not kernel_dir.is_dir():
        return f"the test cache has no kernel modules {kernel_dir}"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _initramfs(dest: Path, busybox: Path, modules_dir: Path) -> None:
    dep = parse_modules_dep((modules_dir / "modules.dep").read_text())
    builtin = (modules_dir / "modules.builtin").read_text().split()
    order = load_order({m: dep[m][1] for m in BOOT_MODULES}, dep, builtin)
    entries = [CpioEntry.dir(d) for d in ("bin", "dev", "proc", "sys", "modules")]
    entries.append(CpioEntry.file("bin/busybox", busybox.read_bytes(), 0o755))
    entries.append(CpioEntry.file("init", INIT.format(modules=" ".join(order)).encode(), 0o755))
    for m in order:
        entries.append(CpioEntry.file(f"modules/{m}.ko", (modules_dir / dep[m][0]).read_bytes()))
    with open(dest, "wb") as out:
        write_newc(entries, out)


def _disk(dest: Path, root: Path, tarball: Path, modules_dir: Path, client_pub: str) -> str:
    """The VM's root filesystem as an ext4 image; returns its sshd host key (public line)."""
    subprocess.run(["tar", "-xpf", tarball, "-C", root, "--numeric-owner"], check=True, timeout=600)
    shutil.copytree(modules_dir, root / "usr/lib/modules" / modules_dir.name, symlinks=True)
    (root / "etc/hostname").write_text("vm1\n")
    (root / "etc/fstab").write_text("/dev/vda / ext4 rw 0 1\n")
    (root / "etc/systemd/network/10-user.network").write_text(NETWORK)
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    for unit in ("systemd-networkd.service", "ssh.service"):
        if not os.path.lexists(wants / unit):
            (wants / unit).symlink_to(f"/lib/systemd/system/{unit}")
    (root / "etc/ssh/sshd_config.d").mkdir(exist_ok=True)
    (root / "etc/ssh/sshd_config.d/vm.conf").write_text(SSHD)
    key = root / "etc/ssh/ssh_host_ed25519_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key], check=True)
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(client_pub)
    os.chmod(ssh_dir / "authorized_keys", 0o600)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-d", root, dest, "6G"], check=True, timeout=900)
    return " ".join(Path(f"{key}.pub").read_text().split()[:2])


@contextlib.contextmanager
def _serve(directory: Path) -> Iterator[int]:
    """`directory` over HTTP on 127.0.0.1 (the VM reaches it as 10.0.2.2); yields the port."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    handler = functools.partial(Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextlib.contextmanager
def _vm(kernel: Path, initrd: Path, disk: Path, port: int, console: Path) -> Iterator[subprocess.Popen[str]]:
    argv = [
        "qemu-system-x86_64", "-accel", "tcg", "-smp", "1", "-m", "2048",
        "-display", "none", "-nodefaults", "-serial", f"file:{console}",
        "-kernel", str(kernel), "-initrd", str(initrd),
        "-append", "console=ttyS0 panic=-1 net.ifnames=0",
        "-drive", f"file={disk},if=virtio,format=raw",
        "-nic", f"user,model=virtio-net-pci,hostfwd=tcp:127.0.0.1:{port}-:22",
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)
        disk.unlink(missing_ok=True)  # 6 GB sparse; the rootfs tree went once the image was made
        initrd.unlink(missing_ok=True)


def _ssh(
    fl: testhosts.Fleet, port: int, command: str, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    argv = ["ssh", "-i", str(fl.key), "-p", str(port), "-o", f"UserKnownHostsFile={fl.known_hosts}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
            "root@127.0.0.1", command]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def _wait_ssh(fl: testhosts.Fleet, port: int, proc: subprocess.Popen[str], console: Path) -> None:
    deadline = time.monotonic() + 420
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"qemu exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''!r}"
                        f"\n{console.read_text(errors='replace')[-3000:]}")  # fmt: skip
        if _ssh(fl, port, "true").returncode == 0:
            return
        time.sleep(1)
    pytest.fail("the VM's sshd never answered\n" + console.read_text(errors="replace")[-4000:])


def _task_result(output: str, task: str) -> re.Match[str] | None:
    """The first `-v` result line of the task whose name starts with `task`, on vm1."""
    return re.search(rf"TASK \[{re.escape(task)}[^\n]*\n(changed|ok|skipping): \[vm1\] => (\{{.*\}})", output)


def test_upgrade_reboots_the_vm_into_the_new_driver(
    upgrade_store: Store, source_snapshot: Path, test_cache: Path, tmp_path: Path
) -> None:
    old, new = upgrade_store.versions
    release = upgrade_store.kernel
    modules_dir = test_cache / "kernels" / release / "lib/modules" / release
    reason = _skip_reason(modules_dir)
    if reason:
        pytest.skip(reason)
    kernel = fetch_kernel(release, archive=DebianArchive(test_cache), cache=test_cache)
    tarball = testhosts.rootfs_tarball(test_cache, VM_PACKAGES)

    home = tmp_path / "home"
    home.mkdir()
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "vm-test", "-f", key], check=True)
    root = tmp_path / "rootfs"
    root.mkdir()
    disk, initrd, console = tmp_path / "disk.img", tmp_path / "initrd.cpio", tmp_path / "console.log"
    host_key = _disk(disk, root, tarball, modules_dir, Path(f"{key}.pub").read_text())
    shutil.rmtree(root)
    _initramfs(initrd, Path(shutil.which("busybox") or "busybox"), modules_dir)
    port = _free_port()
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {host_key}\n")
    fl = testhosts.Fleet(hosts=(), key=key, home=home, known_hosts=known, workdir=tmp_path)

    with _serve(upgrade_store.path) as store_port, _vm(kernel.vmlinuz, initrd, disk, port, console) as proc:
        _wait_ssh(fl, port, proc, console)
        group_vars = {
            **fleet_vars(tmp_path, source_snapshot, old, release),
            "nodeprep_install_root": "/",
            "nvidia_driver_root": "/",
            "nvidia_driver_store": f"http://10.0.2.2:{store_port}",
            "nvidia_driver_doctor_checks": CHECKS,
        }
        group_vars["nodeprep_install_profile"]["driver"]["store"] = "{{ nvidia_driver_store }}"  # type: ignore[index]
        inv = {
            "all": {
                "hosts": {
                    "vm1": {
                        "ansible_host": "127.0.0.1",
                        "ansible_port": port,
                        "ansible_user": "root",
                        "ansible_ssh_private_key_file": str(key),
                        "ansible_python_interpreter": "/usr/bin/python3",
                    }
                },
                "children": {"gpu_nodes": {"hosts": {"vm1": {}}}},
                "vars": group_vars,
            }
        }
        inventory = tmp_path / "inventory.yml"
        inventory.write_text(yaml.safe_dump(inv, sort_keys=True))
        common = {"upgrade_gpu_selftest": False}

        first = testhosts.ansible_playbook(
            fl, "playbooks/upgrade-driver.yml", inventory, extra_vars=common, args=["-v"]
        )
        assert first.returncode == 0, first.output[-6000:]
        loaded = _task_result(first.output, "Upgrade | Reload the modules in place")
        assert loaded, first.output[-6000:]
        print("install run's reload:", loaded.group(0))
        assert _ssh(fl, port, "cat /sys/module/nvidia/version").stdout.strip() == old, first.output[-3000:]
        boot_before = _ssh(fl, port, "cat /proc/sys/kernel/random/boot_id").stdout.strip()

        upgrade = testhosts.ansible_playbook(
            fl,
            "playbooks/upgrade-driver.yml",
            inventory,
            extra_vars={**common, "nvidia_driver_version": new, "upgrade_reload": "reboot"},
            args=["-v"],
        )
        assert upgrade.returncode == 0, upgrade.output[-6000:]
        print("install run:", first.recap, "\nupgrade run:", upgrade.recap)
        reboot = _task_result(upgrade.output, "Upgrade | Reboot")
        assert reboot, upgrade.output[-6000:]
        print("reboot task:", reboot.group(0))
        assert reboot.group(1) == "changed" and '"rebooted": true' in reboot.group(2)
        assert "TASK [Upgrade | Reload the modules in place" in upgrade.output
        skipped = _task_result(upgrade.output, "Upgrade | Reload the modules in place")
        assert skipped and skipped.group(1) == "skipping", upgrade.output[-6000:]

        boot_after = _ssh(fl, port, "cat /proc/sys/kernel/random/boot_id").stdout.strip()
        assert boot_before and boot_after and boot_after != boot_before
        after = _ssh(
            fl,
            port,
            "readlink /opt/nvidia/current; cat /sys/module/nvidia/version; "
            "systemctl is-active nodeprep-nvidia.service; "
            "/usr/local/bin/nodeprep doctor --check module --check kmod --check ldcache --json",
            timeout=120,
        )
        print("after the reboot:", after.stdout, after.stderr)
        lines = after.stdout.splitlines()
        assert lines[0].rstrip("/").endswith(new), after.stdout
        assert lines[1] == new and lines[2] == "active", after.stdout
        assert f"kernel module {new} matches the active user space" in after.stdout, after.stdout
        assert '"ok": true' in after.stdout, after.stdout
        assert "TASK [Upgrade | Doctor gate]" in upgrade.output

        # Run 3: back to the other version with upgrade_reload auto while the new version's modules
        # are loaded and nothing holds them (refcnt 0, no holders, no /dev/nvidia* open): the reload
        # unloads them and loads the other version in place, without a reboot.
        back = testhosts.ansible_playbook(
            fl,
            "playbooks/upgrade-driver.yml",
            inventory,
            extra_vars={**common, "upgrade_reload": "auto"},
            args=["-v"],
        )
        assert back.returncode == 0, back.output[-6000:]
        print("reload-in-place run:", back.recap)
        swapped = _task_result(back.output, "Upgrade | Reload the modules in place")
        assert swapped, back.output[-6000:]
        print("reload-in-place run's reload:", swapped.group(0))
        assert swapped.group(1) == "changed", swapped.group(0)
        result = json.loads(swapped.group(2))
        assert result["action"] == "reload" and result["reboot_required"] is False, result
        assert result["reasons"] == [f"nvidia {new} is loaded and nothing holds it: unload, load {old}"]
        assert result["survey"]["loaded_version"] == new and result["survey"]["processes"] == []
        assert all(m["refcnt"] == 0 and m["holders"] == [] for m in result["survey"]["modules"]), result
        assert result["done"][0].startswith("unloaded nvidia"), result
        not_rebooted = _task_result(back.output, "Upgrade | Reboot")
        assert not_rebooted and not_rebooted.group(1) == "skipping", back.output[-6000:]
        final = _ssh(
            fl,
            port,
            "cat /proc/sys/kernel/random/boot_id; readlink /opt/nvidia/current; "
            "cat /sys/module/nvidia/version",
        )
        print("after the reload in place:", final.stdout, final.stderr)
        boot_id, current, version = final.stdout.splitlines()
        assert boot_id == boot_after, "the reload in place rebooted the VM"
        assert current.rstrip("/").endswith(old) and version == old, final.stdout
    assert proc.returncode is not None and not disk.exists()  # qemu killed, its disk removed
