"""Fabric Manager on the node: a user space with NVIDIA's Fabric Manager files (from an archive packed
in its real layout around stand-in binaries, tests/support/fmarchive.py) installed into a root with
the real `nodeprep install`: the versioned root holds it, the unit runs it through `current` where the
machine needs it (ExecCondition), and a root whose recorded Fabric Manager is another version is
refused before anything switches. No GPU involved."""

from __future__ import annotations

import configparser
import hashlib
import os
from pathlib import Path

from click.testing import CliRunner

from nodeprep import artifact
from nodeprep.builder import fabricmanager
from nodeprep.cli import main
from nodeprep.node.integration import render_fabricmanager_unit
from tests.support import fmarchive
from tests.support import rawartifact as ra
from tests.support.standin import KERNEL, standin_kmod
from tests.unit.join.conftest import build_payload

VERSION = "535.309.01"


def store_with_fm(work: Path, recorded: str) -> Path:
    """A store whose user space of VERSION carries Fabric Manager files recorded as version `recorded`."""
    store = work / "store"
    store.mkdir(parents=True)
    payload = build_payload(work / "us", VERSION)
    archive = fmarchive.pack(work / "fm", VERSION)
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    fm = fabricmanager.read_archive(archive, sha, VERSION, "amd64")
    fabricmanager.place(fm, payload, {})
    record = {**fm.record(), "version": recorded}
    manifest = artifact.Manifest(kind="userspace", driver_version=VERSION, arch="amd64", os="debian-12",
                                 input_digest="0" * 64, inputs={}, extra={"fabricmanager": record})
    us, _ = artifact.pack(payload, manifest, store)
    return ra.store_with(store, [(us, artifact.read_manifest(us)), standin_kmod(work / "ko", VERSION, store)])


def install(store: Path, root: Path):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, ["install", "--store", str(store), "--driver", VERSION, "--kernel",
                                     KERNEL, "--activate", "--root", str(root)])


def test_the_unit_runs_the_active_fabric_manager_where_the_machine_needs_it() -> None:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string(render_fabricmanager_unit("nodeprep"))
    assert cp["Service"]["ExecCondition"] == "nodeprep fabric-manager --condition"
    assert cp["Service"]["ExecStart"] == ("/opt/nvidia/current/bin/nv-fabricmanager -c "
                                          "/opt/nvidia/current/share/nvidia/nvswitch/fabricmanager.cfg")
    assert cp["Unit"]["After"].split() == ["nodeprep-nvidia.service", "nodeprep-persistenced.service"]
    assert cp["Unit"]["Before"].split() == ["containerd.service", "kubelet.service"]
    assert cp["Unit"]["ConditionPathExists"] == "/opt/nvidia/current/bin/nv-fabricmanager"


def test_fabric_manager_of_the_drivers_version_is_installed_with_its_unit(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for d in ("etc/systemd/system", "usr/bin", "usr/lib/x86_64-linux-gnu", "var/lib", "opt"):
        (root / d).mkdir(parents=True)
    r = install(store_with_fm(tmp_path, VERSION), root)
    assert r.exit_code == 0, r.output
    vdir = root / "opt/nvidia" / VERSION
    assert (vdir / "bin/nv-fabricmanager").read_bytes()[:4] == b"\x7fELF"
    assert (vdir / "lib64/libnvfm.so.1").is_file()
    assert "TOPOLOGY_FILE_PATH=/opt/nvidia/current/share/nvidia/nvswitch" in (
        vdir / "share/nvidia/nvswitch/fabricmanager.cfg").read_text()
    unit = root / "etc/systemd/system/nodeprep-fabricmanager.service"
    assert "ExecCondition=nodeprep fabric-manager --condition" in unit.read_text()
    wants = root / "etc/systemd/system/multi-user.target.wants/nodeprep-fabricmanager.service"
    assert os.readlink(wants) == "../nodeprep-fabricmanager.service"
    r = CliRunner().invoke(main, ["uninstall", "--root", str(root)])
    assert r.exit_code == 0, r.output
    assert not os.path.lexists(unit) and not os.path.lexists(wants)


def test_a_fabric_manager_of_another_version_is_refused_before_anything_switches(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for d in ("etc/systemd/system", "usr/bin", "var/lib", "opt"):
        (root / d).mkdir(parents=True)
    r = install(store_with_fm(tmp_path, "590.48.01"), root)
    assert r.exit_code == 2, r.output
    errors = [ln for ln in r.stderr.strip().splitlines() if ln.startswith("error: ")]
    assert errors == [f"error: driver {VERSION}: incomplete user space, refusing to install it: its Fabric "
                      f"Manager is 590.48.01, the driver is {VERSION} (it must be the driver's version)"]
    assert not os.path.lexists(root / "opt/nvidia/current")
    assert not os.path.lexists(root / "opt/nvidia" / VERSION)
    assert not os.path.lexists(root / "etc/systemd/system/nodeprep-fabricmanager.service")


def install_with(store: Path, root: Path, *flags: str, profile: Path | None = None):  # type: ignore[no-untyped-def]
    args = ["install", "--store", str(store), "--driver", VERSION, "--kernel", KERNEL, "--activate",
            "--root", str(root), *flags]
    return CliRunner().invoke(main, args + (["--profile", str(profile)] if profile else []))


def test_the_profile_chooses_which_daemons_get_a_unit(tmp_path: Path) -> None:
    """driver.persistenced / driver.fabricmanager (and their flags): auto writes Fabric Manager's unit
    with the hardware's ExecCondition, always without it, never/false none; switching a daemon off
    removes the unit nodeprep wrote; uninstall removes them either way."""
    root = tmp_path / "root"
    for d in ("etc/systemd/system", "usr/bin", "usr/lib/x86_64-linux-gnu", "var/lib", "opt"):
        (root / d).mkdir(parents=True)
    store = store_with_fm(tmp_path, VERSION)
    units = root / "etc/systemd/system"
    fm, pd = units / "nodeprep-fabricmanager.service", units / "nodeprep-persistenced.service"
    wants = units / "multi-user.target.wants"

    r = install_with(store, root, "--fabricmanager-mode", "always")
    assert r.exit_code == 0, r.output
    assert "ExecCondition" not in fm.read_text() and "ExecStart=/opt/nvidia/current/bin/nv-fabricmanager" in (
        fm.read_text())
    assert pd.is_file()

    profile = tmp_path / "node.yaml"
    profile.write_text(f"driver:\n  version: \"{VERSION}\"\n  persistenced: false\n  fabricmanager: never\n")
    r = CliRunner().invoke(main, ["activate", VERSION, "--root", str(root), "--profile", str(profile),
                                  "--check"])
    assert r.exit_code == 0, r.output
    assert fm.is_file() and pd.is_file()  # the plan changed nothing
    r = CliRunner().invoke(main, ["activate", VERSION, "--root", str(root), "--profile", str(profile)])
    assert r.exit_code == 0, r.output
    for unit in (fm, pd):
        assert not os.path.lexists(unit) and not os.path.lexists(wants / unit.name)

    # another's unit of that name is not nodeprep's: never removed
    pd.write_text("[Unit]\nDescription=the image's own\n")
    r = CliRunner().invoke(main, ["activate", VERSION, "--root", str(root), "--profile", str(profile)])
    assert r.exit_code == 0, r.output
    assert pd.read_text() == "[Unit]\nDescription=the image's own\n"
    pd.unlink()

    profile.write_text(f"driver:\n  version: \"{VERSION}\"\n")  # the defaults: persistenced, auto
    r = CliRunner().invoke(main, ["activate", VERSION, "--root", str(root), "--profile", str(profile)])
    assert r.exit_code == 0, r.output
    assert "ExecCondition=nodeprep fabric-manager --condition" in fm.read_text() and pd.is_file()
    assert os.readlink(wants / fm.name) == f"../{fm.name}"
    r = install_with(store, root, "--no-persistenced")
    assert r.exit_code == 0, r.output
    assert not os.path.lexists(pd) and fm.is_file()
    r = CliRunner().invoke(main, ["uninstall", "--root", str(root)])
    assert r.exit_code == 0, r.output
    assert not os.path.lexists(fm) and not os.path.lexists(wants / fm.name)
