"""Nothing of an image under `--root` is run (issue #35, finding 3): containerd's default spec, which
the handlers' base spec starts from, comes from nodeprep's data by the containerd version the image's
dpkg status names, never from the image's `ctr`.

The image is hostile: its /usr/bin/ctr and /usr/local/bin/ctr are shell scripts (with the host's sh
and libc beside them, so that `chroot IMG ctr` really runs) that leave a canary and print a spec of
their own, and its own etc/nodeprep/node.yaml turns CDI on. The real CLI runs `runtime --root IMG
--check`, `runtime --root IMG` and `uninstall --root IMG --check`; the data is checked against the
real `ctr oci spec` of three Debian releases (tests/fixtures/ctr-oci-spec, SOURCES.md there).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from nodeprep.cli import main
from nodeprep.runtime import containerd as ctd
from nodeprep.runtime import ocidefault, ocihooks
from tests.support.fixtures import FIXTURES

from .conftest import VERSION

CANARY = "ran-from-image"
EVIL = {"process": {"args": ["evil"]}, "root": {"path": "evil"}, "mounts": [], "linux": {"evil": True}}
SCRIPT = f"#!/bin/sh\necho ran >> /{CANARY}\necho ran >> /tmp/{CANARY}\nprintf '%s' '{json.dumps(EVIL)}'\n"
RECORDED = FIXTURES / "ctr-oci-spec"
STATUS = """Package: containerd-other
Status: install ok installed
Version: 9.9.9

Package: containerd
Status: install ok installed
Architecture: amd64
Version: {version}
Description: daemon to control runC
"""


def _hostile_image(root: Path, *, package: str | None) -> Path:
    """`root` with CDI on in its own profile, canary ctr scripts that would run if chrooted into, and
    (with `package`) the containerd version in its dpkg status."""
    (root / "etc/nodeprep").mkdir(parents=True, exist_ok=True)
    (root / "etc/nodeprep/node.yaml").write_text(
        yaml.safe_dump({"driver": {"version": VERSION}, "runtime": {"cdi": True}}))
    for src, dest in ((Path("/bin/sh"), "bin/sh"), (Path("/lib64/ld-linux-x86-64.so.2"),
                      "lib64/ld-linux-x86-64.so.2"), (Path("/lib/x86_64-linux-gnu/libc.so.6"),
                      "lib/x86_64-linux-gnu/libc.so.6")):
        if src.exists():
            (root / dest).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src.resolve(), root / dest)
    (root / "tmp").mkdir(exist_ok=True)
    for ctr in ("usr/bin/ctr", "usr/local/bin/ctr"):
        (root / ctr).parent.mkdir(parents=True, exist_ok=True)
        (root / ctr).write_text(SCRIPT)
        (root / ctr).chmod(0o755)
    if package is not None:
        (root / "var/lib/dpkg").mkdir(parents=True, exist_ok=True)
        (root / "var/lib/dpkg/status").write_text(STATUS.format(version=package))
    return root


def _cli(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def _ran(root: Path) -> list[str]:
    return [str(p) for p in (root / CANARY, root / "tmp" / CANARY) if p.exists()]


def _recorded(name: str) -> dict[str, object]:
    return dict(json.loads((RECORDED / f"{name}.json").read_text()))


def test_runtime_and_uninstall_never_run_the_image_s_ctr(node_root: Path, smi_xml: Path) -> None:
    image = _hostile_image(node_root, package="1.7.24~ds1-6+deb13u1")
    target = node_root / "etc/containerd/nodeprep-base-spec.json"
    code, out, err = _cli("runtime", "--root", str(image), "--check", "--json",
                          "--nvidia-smi-xml", str(smi_xml))
    assert code == 0, err
    assert _ran(image) == [] and not target.exists()
    assert "/etc/containerd/nodeprep-base-spec.json" in [f["path"] for f in json.loads(out)["files"]]
    code, _, err = _cli("runtime", "--root", str(image), "--json", "--nvidia-smi-xml", str(smi_xml))
    assert code == 0, err
    assert _ran(image) == []
    written = json.loads(target.read_text())
    want = _recorded("1.7.24~ds1-6+deb13u1")
    want["ociVersion"] = "1.1.0"  # upstream's 1.7.24 (Debian's repack prints its own runtime-spec's)
    assert written == json.loads(ctd.render_base_spec(want, ocihooks.gate_hook()))
    assert "evil" not in target.read_text()
    code, out, err = _cli("uninstall", "--root", str(image), "--check")
    assert code == 0, err
    assert _ran(image) == []
    assert "nodeprep-base-spec.json" in out + err


def test_without_a_known_version_no_base_spec_and_nothing_run(node_root: Path, smi_xml: Path) -> None:
    image = _hostile_image(node_root, package=None)
    code, out, err = _cli("runtime", "--root", str(image), "--json", "--nvidia-smi-xml", str(smi_xml))
    assert code == 0, err
    assert _ran(image) == []
    assert not (node_root / "etc/containerd/nodeprep-base-spec.json").exists()
    warnings = " ".join(json.loads(out)["warnings"])
    assert ("containerd base spec not written (containerd's version is not known: no containerd or "
            f"containerd.io package in /var/lib/dpkg/status under {image}; the root's ctr is never run)"
            in warnings)
    code, out, err = _cli("uninstall", "--root", str(image), "--check")
    assert code == 0, err
    assert _ran(image) == []


@pytest.mark.parametrize("package", ["1.6.20~ds1-1+deb12u3", "1.7.24~ds1-6+deb13u1", "2.1.9+ds1-5"])
def test_the_data_is_what_ctr_oci_spec_prints(package: str) -> None:
    version = ocidefault.parse_version(package)
    assert version is not None
    ours, real = ocidefault.spec_for(version), _recorded(package)
    assert ours is not None
    debian = {"1.7.24~ds1-6+deb13u1": ("1.1.0", "1.2.0")}  # (upstream's, Debian's repack's)
    if package in debian:
        assert (ours["ociVersion"], real["ociVersion"]) == debian[package]
        real["ociVersion"] = ours["ociVersion"]
    assert ours == real


def test_versions_the_data_does_not_know_write_no_base_spec(tmp_path: Path) -> None:
    assert ocidefault.spec_for((1, 5, 18)) is None and ocidefault.spec_for((2, 4, 0)) is None
    assert ocidefault.spec_for((1, 6, 1))["process"]["capabilities"]["inheritable"]  # type: ignore[index]
    assert "/sys/devices/virtual/powercap" not in ocidefault.spec_for((1, 7, 10))["linux"]["maskedPaths"]  # type: ignore[index]
    assert "/sys/devices/virtual/powercap" in ocidefault.spec_for((1, 6, 26))["linux"]["maskedPaths"]  # type: ignore[index]
    assert ocidefault.spec_for((2, 3, 4))["ociVersion"] == "1.3.0"  # type: ignore[index]
    _hostile_image(tmp_path, package="1:3.0.1-1")
    (tmp_path / "etc/containerd").mkdir(parents=True)
    spec, why = ctd.default_spec(tmp_path)
    assert spec is None and why is not None
    assert why.startswith("containerd 1:3.0.1-1 (package in /var/lib/dpkg/status under ")
    assert why.endswith("its default spec is not known to nodeprep (known: 1.6.0 up to 2.4.0)")
    assert _ran(tmp_path) == []


def test_dpkg_status_is_read_as_data() -> None:
    assert ocidefault.dpkg_version(STATUS.format(version="2.1.9+ds1-5")) == "2.1.9+ds1-5"
    removed = "Package: containerd.io\nStatus: deinstall ok config-files\nVersion: 1.7.0-1\n"
    assert ocidefault.dpkg_version(removed) is None
    docker = "Package: containerd.io\nStatus: install ok installed\nVersion: 1.7.27-1\n"
    assert ocidefault.dpkg_version(docker) == "1.7.27-1"
    assert ocidefault.parse_version("2:1.6.20~ds1") == (1, 6, 20)
    assert ocidefault.parse_version("unknown") is None


@pytest.mark.skipif(shutil.which("systemctl") is None, reason="systemctl enables units under --root")
def test_enabling_kubelet_under_an_image_never_runs_its_update_rc_d(tmp_path: Path) -> None:
    """An image whose kubelet is an init.d script, not a native unit: plain `systemctl --root=IMG
    enable` hands it to systemd-sysv-install, which runs `chroot IMG /usr/sbin/update-rc.d` (the
    image's program, as root). The action join plans for an image root skips SysV (the unit is then
    "not found": the join fails with systemctl's line, the image's program unrun)."""
    from nodeprep import runner
    from nodeprep.join.joinplan import kubelet_actions

    image = tmp_path / "img"
    (image / "etc/init.d").mkdir(parents=True)
    (image / "usr/sbin").mkdir(parents=True)
    (image / "bin").mkdir()
    shutil.copy(shutil.which("busybox") or "/bin/busybox", image / "bin/sh")
    init = image / "etc/init.d/kubelet"
    init.write_text("#!/bin/sh\n### BEGIN INIT INFO\n# Provides: kubelet\n# Default-Start: 2 3 4 5\n"
                    "# Default-Stop:\n### END INIT INFO\n")
    init.chmod(0o755)
    (image / "usr/sbin/update-rc.d").write_text(f"#!/bin/sh\necho ran >> /{CANARY}\n")
    (image / "usr/sbin/update-rc.d").chmod(0o755)
    (action,) = kubelet_actions(image, changed=True, joined=False, live=False)
    r = runner.run(list(action.argv), check=False, timeout=60)
    assert not (image / CANARY).exists(), r
    assert r.returncode != 0 and "kubelet.service does not exist" in r.stderr
