"""The real NVIDIA kernel modules (the shared `real_build`: Debian 12's nvidia-kernel-source compiled
for Debian 12's current kernel) installed and activated into a Debian rootfs: modinfo, depmod and
modprobe (host binaries pointed at the root) see the real module graph through nodeprep's links."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nodeprep import artifact
from nodeprep.node.doctor import doctor

from .helpers import NodeStore, install_cli, resolve, run

pytestmark = pytest.mark.slow


def test_real_kmod_install_and_module_graph(
    real_build,
    node_store: NodeStore,
    rootfs: Path,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    version, rel = real_build.driver_version, real_build.kernel_release
    store = artifact.LocalStore(tmp_path / "store")
    store.publish(real_build.kmod, artifact.read_manifest(real_build.kmod))
    userspace = real_build.userspace or (node_store.path / f"nvidia-userspace-{version}-amd64.tar.zst")
    if not Path(userspace).exists():
        pytest.fail(f"no user-space artifact for {version} (real build: {real_build.userspace})")
    store.publish(Path(userspace), artifact.read_manifest(Path(userspace)))

    r = install_cli(store.path, version, rel, rootfs, "--activate", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["installed_kmod"] is True

    links = rootfs / "lib/modules" / rel / "updates/nodeprep"
    ko = links / "nvidia.ko"
    assert run(["modinfo", "-F", "version", ko]).stdout.strip() == version
    assert run(["modinfo", "-F", "vermagic", ko]).stdout.split()[0] == rel
    assert resolve(rootfs, f"/lib/modules/{rel}/updates/nodeprep/nvidia.ko") == (
        f"/opt/nvidia/{version}/modules/{rel}/nvidia.ko"
    )
    dep = (rootfs / "lib/modules" / rel / "modules.dep").read_text()
    assert "updates/nodeprep/nvidia-uvm.ko: updates/nodeprep/nvidia.ko" in dep
    assert "updates/nodeprep/nvidia-modeset.ko: updates/nodeprep/nvidia.ko" in dep
    aliases = (rootfs / "lib/modules" / rel / "modules.alias").read_text()
    assert any(a.startswith("alias pci:v000010DEd") and a.endswith(" nvidia") for a in aliases.splitlines())
    shown = run(
        ["modprobe", "-d", str(rootfs), "-S", rel, "--show-depends", "nvidia-uvm"]
    ).stdout.splitlines()
    assert [line.rsplit("/", 1)[-1].strip() for line in shown] == ["nvidia.ko", "nvidia-uvm.ko"]
    report = doctor(rootfs, checks={"state", "ldcache"})
    assert report.ok, report.render()
