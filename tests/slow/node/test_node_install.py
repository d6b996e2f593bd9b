"""install / activate / rollback / list / remove into a real Debian 12 rootfs (--root), with the real
user space built from Debian's packages; checked from inside the root with chroot (ldconfig -p,
readlink -f, the installed nvidia-smi)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nodeprep.node.doctor import doctor
from nodeprep.node.state import load_state

from .helpers import V_NEW, V_OLD, NodeStore, cli, install_cli, ldcache, resolve, run

pytestmark = pytest.mark.slow


def install(store: NodeStore, root: Path, version: str, *extra: str) -> dict:
    r = install_cli(store.path, version, store.kernel, root, "--json", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def smi(root: Path, version: str) -> int:
    return run_rc(["chroot", str(root), f"/opt/nvidia/{version}/bin/nvidia-smi"])


def run_rc(argv: list[str]) -> int:
    import subprocess

    return subprocess.run(argv, capture_output=True).returncode


def test_install_activate_rollback_in_debian_rootfs(node_store: NodeStore, rootfs: Path) -> None:
    first = install(node_store, rootfs, V_NEW)
    assert first["changed"] and first["installed_userspace"] and first["installed_kmod"]
    vdir = rootfs / "opt" / "nvidia" / V_NEW
    assert json.loads((vdir / "manifest.json").read_text())["kind"] == "userspace"
    kman = json.loads((vdir / "modules" / node_store.kernel / "manifest.json").read_text())
    assert kman["kind"] == "kmod" and kman["kernel_release"] == node_store.kernel
    # ldconfig -n made the soname links; the real nvidia-smi cannot find NVML before activation
    assert os.readlink(vdir / "lib64" / "libcuda.so.1") == f"libcuda.so.{V_NEW}"
    assert "libnvidia-ml.so.1" not in ldcache(rootfs)
    assert smi(rootfs, V_NEW) == 12  # NVML library not found

    again = install(node_store, rootfs, V_NEW)
    assert again["changed"] is False and "already installed" in " ".join(again["notes"])
    # an installed version needs nothing from the store: a re-run works with the store gone, while
    # adding a kernel (something to fetch) still needs it
    gone = rootfs.parent / "no-such-store"
    r = install_cli(gone, V_NEW, node_store.kernel, rootfs, "--json", "--node-store", str(gone))
    assert r.returncode == 0, r.stderr
    done = json.loads(r.stdout)
    assert not done["installed_userspace"] and not done["installed_kmod"]
    # its one change: the kernel hook's record in state.json names the store the node will reach
    # (a directory of this machine is never recorded for a --root image without --node-store)
    assert done["changed"] is True and load_state(rootfs).kernel_hook["store"] == str(gone)
    r = install_cli(gone, V_NEW, "6.1.0-99-amd64", rootfs)
    assert r.returncode == 2 and str(gone) in r.stderr and "Traceback" not in r.stderr
    node_view = ("--node-store", str(node_store.path))
    assert install(node_store, rootfs, V_NEW, *node_view)["changed"] is True  # the record names it again
    assert install(node_store, rootfs, V_NEW, *node_view)["changed"] is False
    # without --node-store, a directory of this machine never replaces the image's record
    assert install(node_store, rootfs, V_NEW)["changed"] is False
    assert load_state(rootfs).kernel_hook["store"] == str(node_store.path)

    r = cli("activate", V_NEW, "--root", str(rootfs))
    assert r.returncode == 0, r.stderr
    assert "module loading skipped" in r.stderr
    cache = ldcache(rootfs)
    assert cache["libcuda.so.1"] == "/opt/nvidia/current/lib64/libcuda.so.1"
    assert cache["libnvidia-ml.so.1"] == "/opt/nvidia/current/lib64/libnvidia-ml.so.1"
    assert resolve(rootfs, cache["libnvidia-ml.so.1"]) == f"/opt/nvidia/{V_NEW}/lib64/libnvidia-ml.so.{V_NEW}"
    assert smi(rootfs, V_NEW) == 9  # NVML found, no kernel driver to talk to
    assert (rootfs / "etc/ld.so.conf.d/00-nvidia.conf").read_text() == "/opt/nvidia/current/lib64\n"
    assert "blacklist nouveau" in (rootfs / "etc/modprobe.d/nodeprep-nvidia.conf").read_text()
    unit = (rootfs / "etc/systemd/system/nodeprep-nvidia.service").read_text()
    assert "Before=containerd.service kubelet.service" in unit and "load-modules" in unit
    assert (rootfs / "etc/systemd/system/multi-user.target.wants/nodeprep-nvidia.service").is_symlink()
    # firmware where the kernel module looks for it, through the versioned root
    fw = rootfs / "lib/firmware/nvidia" / V_NEW
    assert sorted(p.name for p in fw.iterdir()) == ["gsp_ga10x.bin", "gsp_tu10x.bin"]
    assert resolve(rootfs, f"/lib/firmware/nvidia/{V_NEW}") == f"/opt/nvidia/{V_NEW}/firmware/nvidia/{V_NEW}"
    # depmod indexed the links: modprobe (host binary, -d ROOT) resolves the modules into the active root
    dep = (rootfs / "lib/modules" / node_store.kernel / "modules.dep").read_text()
    assert "updates/nodeprep/nvidia-uvm.ko:" in dep
    shown = run(
        ["modprobe", "-d", str(rootfs), "-S", node_store.kernel, "--show-depends", "nvidia-uvm"]
    ).stdout
    assert "updates/nodeprep/nvidia-uvm.ko" in shown
    assert os.path.realpath(rootfs / "lib/modules" / node_store.kernel / "updates/nodeprep/nvidia.ko") == str(
        (vdir / "modules" / node_store.kernel / "nvidia.ko").resolve()
    )

    switched = install(node_store, rootfs, V_OLD, "--activate")
    assert switched["changed"] and switched["activation"]["previous"] == V_NEW
    target = resolve(rootfs, "/opt/nvidia/current/lib64/libnvidia-ml.so.1")
    assert target == f"/opt/nvidia/{V_OLD}/lib64/libnvidia-ml.so.{V_OLD}"
    assert (
        run(
            [
                "modinfo",
                "-F",
                "version",
                rootfs / "lib/modules" / node_store.kernel / "updates/nodeprep/nvidia.ko",
            ]
        ).stdout.strip()
        == V_OLD
    )
    state = load_state(rootfs)
    assert state.active == V_OLD and state.previous == V_NEW
    assert state.installed[V_OLD].kernels == (node_store.kernel,)

    r = cli("rollback", "--root", str(rootfs), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["version"] == V_NEW
    assert resolve(rootfs, "/opt/nvidia/current/lib64/libnvidia-ml.so.1") == (
        f"/opt/nvidia/{V_NEW}/lib64/libnvidia-ml.so.{V_NEW}"
    )
    assert smi(rootfs, V_NEW) == 9

    r = cli("activate", V_NEW, "--root", str(rootfs), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["changed"] is False

    listed = json.loads(cli("list", "--root", str(rootfs), "--json").stdout)
    assert listed["active"] == V_NEW and listed["previous"] == V_OLD
    assert listed["installed"][V_OLD]["kernels"] == [node_store.kernel]

    report = doctor(rootfs, checks={"state", "ldcache"}, require_cuda="12.2")
    assert report.ok, report.render()
    assert [c.name for c in report.checks] == ["state", "ldcache", "cuda"]

    r = cli("remove", V_NEW, "--root", str(rootfs))
    assert r.returncode == 2 and "active" in r.stderr and (rootfs / "opt/nvidia" / V_NEW).is_dir()
    r = cli("remove", V_OLD, "--root", str(rootfs), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["changed"] is True
    assert not (rootfs / "opt/nvidia" / V_OLD).exists()
    assert not os.path.lexists(rootfs / "lib/firmware/nvidia" / V_OLD)
    assert (rootfs / "lib/firmware/nvidia" / V_NEW).is_dir()
    assert sorted(load_state(rootfs).installed) == [V_NEW]
    r = cli("rollback", "--root", str(rootfs))
    assert r.returncode == 1 and "nothing to roll back" in r.stderr


def test_kmod_for_another_kernel_is_refused_before_anything_changes(
    node_store: NodeStore, rootfs: Path
) -> None:
    before = sorted(str(p.relative_to(rootfs)) for p in rootfs.rglob("*"))
    other = "6.1.0-1-amd64"
    r = install_cli(node_store.path, V_NEW, other, rootfs)
    assert r.returncode == 2
    assert node_store.kernel in r.stderr and other in r.stderr and "vermagic" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert sorted(str(p.relative_to(rootfs)) for p in rootfs.rglob("*")) == before


def test_kernel_flags_mismatch_is_refused(node_store: NodeStore, rootfs: Path, tmp_path: Path) -> None:
    """The target kernel's own modules (here: one of our stubs whose vermagic flags were edited in
    place, standing in for a kernel built with another configuration) disagree with the artifact."""
    kdir = rootfs / "lib/modules" / node_store.kernel / "kernel"
    kdir.mkdir(parents=True)
    ko = node_store.path / f"nvidia-kmod-{V_NEW}-proprietary-{node_store.kernel}.tar.zst"
    from nodeprep.artifact import extract

    ex = tmp_path / "ex"
    ex.mkdir()
    extract(ko, ex)
    data = (ex / "modules" / node_store.kernel / "nvidia.ko").read_bytes()
    old = node_store.vermagic.encode()
    assert b" preempt " in old
    data = data.replace(old, old.replace(b" preempt ", b" preempX "), 1)  # same length: ELF stays valid
    (kdir / "fake-in-tree.ko").write_bytes(data)
    r = install_cli(node_store.path, V_NEW, node_store.kernel, rootfs)
    assert r.returncode == 2, r.stderr
    assert "vermagic flags differ" in r.stderr and "preempX" in r.stderr
    opt = rootfs / "opt/nvidia"
    assert not opt.exists() or not any(opt.iterdir())  # staging removed, nothing installed


def test_kmod_for_a_second_kernel_is_a_change(node_store: NodeStore, rootfs: Path, tmp_path: Path) -> None:
    """Adding a kmod for another kernel to an installed version: the same real stub modules, packed as a
    kmod for a second kernel release by rewriting the release in their vermagic (same length)."""
    from dataclasses import replace

    from nodeprep import artifact

    install(node_store, rootfs, V_NEW, "--activate")
    rel2 = node_store.kernel.replace("-amd64", "-amd6x")  # same length: the ELF files stay valid
    assert rel2 != node_store.kernel
    src = tmp_path / "src"
    src.mkdir()
    m = artifact.extract(
        node_store.path / f"nvidia-kmod-{V_NEW}-proprietary-{node_store.kernel}.tar.zst", src
    )
    payload = tmp_path / "payload" / "modules" / rel2
    payload.mkdir(parents=True)
    for ko in (src / "modules" / node_store.kernel).glob("*.ko"):
        (payload / ko.name).write_bytes(ko.read_bytes().replace(node_store.kernel.encode(), rel2.encode()))
    store2 = artifact.LocalStore(tmp_path / "store2")
    for e in artifact.LocalStore(node_store.path).entries():
        p = node_store.path / e.name
        store2.publish(p, artifact.read_manifest(p))
    path, m2 = artifact.pack(
        tmp_path / "payload",
        replace(m, kernel_release=rel2, vermagic=m.vermagic.replace(node_store.kernel, rel2)),
        tmp_path / "out",
    )
    store2.publish(path, m2)
    r = install_cli(store2.path, V_NEW, rel2, rootfs, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["changed"] and out["installed_kmod"] and not out["installed_userspace"]
    assert load_state(rootfs).installed[V_NEW].kernels == tuple(sorted([node_store.kernel, rel2]))
    # the active version got links + depmod for the new kernel too
    assert "updates/nodeprep/nvidia.ko:" in (rootfs / "lib/modules" / rel2 / "modules.dep").read_text()
    r = install_cli(store2.path, V_NEW, rel2, rootfs, "--json")
    assert json.loads(r.stdout)["changed"] is False
