"""Reads under `--root` resolve the image's links beneath the root too (issue #25): the labels' host
facts (os-release, state.json, the `current` link, lib/modules), the default profile path, the
containerd imports a glob matches and doctor's ld cache. Each image link points at a host file or
directory outside the root with a marker of its own; the marker never shows up in the output, and
the file the link names inside the root (as the booted node resolves it) is the one read.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from nodeprep.cli import main
from nodeprep.runtime import containerd as ctd
from tests.support.fixtures import NVIDIA_SMI
from tests.support.standin import KERNEL, standin_store

V = "535.309.01"
CAPTURE = NVIDIA_SMI / "a100-sxm4-80gb-mig_535.54.03.xml"


def _inside(root: Path, outside: Path) -> Path:
    """Where an absolute image link to `outside` leads under `root` (RESOLVE_IN_ROOT)."""
    return root / str(outside).lstrip("/")


def _labels(root: Path, tmp_path: Path) -> dict[str, str]:
    sysfs = tmp_path / "sys"
    sysfs.mkdir(exist_ok=True)
    r = CliRunner().invoke(main, ["labels", "--root", str(root), "--sysfs-root", str(sysfs),
                                  "--nvidia-smi-xml", str(CAPTURE), "--cloud", "none", "--format", "json"])
    assert r.exit_code == 0, r.output
    assert "outside" not in r.output and "999.88.77" not in r.output and "hostileos" not in r.output, r.output
    return json.loads(r.stdout)["labels"]


def test_labels_read_host_facts_beneath_the_root(tmp_path: Path) -> None:
    out = tmp_path / "outside"
    (out / "state").mkdir(parents=True)
    (out / "state/state.json").write_text(json.dumps({"active": "999.88.77"}))
    (out / "os-release").write_text("ID=hostileos\nVERSION_ID=66\n")
    (out / "modules/9.9.77-outside/kernel").mkdir(parents=True)
    root = tmp_path / "root"
    for d in ("etc", "var/lib", "lib"):
        (root / d).mkdir(parents=True)
    (root / "etc/os-release").symlink_to(out / "os-release")
    (root / "var/lib/nodeprep").symlink_to(out / "state")
    (root / "lib/modules").symlink_to(out / "modules")
    labels = _labels(root, tmp_path)
    assert "nodeprep.dev/os" not in labels and "nodeprep.dev/kernel" not in labels
    assert "nodeprep.dev/driver-version" not in labels

    # the same links, now with files where they lead inside the image: those are read
    _inside(root, out / "os-release").parent.mkdir(parents=True)
    _inside(root, out / "os-release").write_text("ID=imageos\nVERSION_ID=13\n")
    _inside(root, out / "modules/6.12.0-image/kernel").mkdir(parents=True)
    _inside(root, out / "state").mkdir(parents=True)
    _inside(root, out / "state/state.json").write_text(json.dumps({"active": "535.216.03"}))
    labels = _labels(root, tmp_path)
    assert labels["nodeprep.dev/os"] == "imageos-13" and labels["nodeprep.dev/kernel"] == "6.12.0-image"
    assert labels["nodeprep.dev/driver-version"] == "535.216.03"


def test_labels_current_link_and_driver_root_beneath_the_root(tmp_path: Path) -> None:
    """`current` as an absolute link, and a driver root whose modules directory is a link out."""
    out = tmp_path / "outside"
    (out / "modules/9.9.77-outside").mkdir(parents=True)
    (out / "modules/9.9.77-outside/manifest.json").write_text(json.dumps({"kernel_release": "9.9.77-outside",
                                                                           "os": "outside-os"}))
    root = tmp_path / "root"
    (root / f"opt/nvidia/{V}").mkdir(parents=True)
    (root / f"opt/nvidia/{V}/modules").symlink_to(out / "modules")
    (root / "opt/nvidia/current").symlink_to(f"/opt/nvidia/{V}")
    labels = _labels(root, tmp_path)
    assert labels["nodeprep.dev/driver-version"] == V
    assert "nodeprep.dev/kernel" not in labels and "nodeprep.dev/artifact-kernel" not in labels


def linked_etc_nodeprep(root: Path, outside: Path, profile: str) -> None:
    """ROOT/etc/nodeprep an absolute link to the host directory `outside`, whose node.yaml is
    `profile`: what a root must never read or write through."""
    outside.mkdir()
    (outside / "node.yaml").write_text(profile)
    (root / "etc").mkdir(parents=True)
    (root / "etc/nodeprep").symlink_to(outside)


def test_default_profile_path_resolves_beneath_the_root(tmp_path: Path) -> None:
    out, root = tmp_path / "outside", tmp_path / "root"
    linked_etc_nodeprep(root, out, "driver: {version: '535.54.03', store: /srv/outside-store}\n")
    r = CliRunner().invoke(main, ["profile", "check", "--root", str(root), "--json"])
    assert r.exit_code == 2 and "outside-store" not in r.output, r.output
    errors = [line for line in r.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and str(_inside(root, out / "node.yaml")) in errors[0], r.output
    _inside(root, out).mkdir(parents=True)
    _inside(root, out / "node.yaml").write_text("driver: {version: '535.309.01', store: /srv/image-store}\n")
    r = CliRunner().invoke(main, ["profile", "check", "--root", str(root), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["driver"]["store"] == "/srv/image-store", r.output


def test_containerd_imports_a_glob_matches_resolve_beneath_the_root(tmp_path: Path) -> None:
    out = tmp_path / "outside"
    out.mkdir()
    table = '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.{name}]\nruntime_type = "{name}"\n'
    (out / "extra.toml").write_text("version = 2\n" + table.format(name="outside-marker"))
    root = tmp_path / "root"
    (root / "etc/containerd/conf.d").mkdir(parents=True)
    (root / "etc/containerd/config.toml").write_text(
        'version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\n')
    (root / "etc/containerd/conf.d/extra.toml").symlink_to(out / "extra.toml")
    _inside(root, out).mkdir(parents=True)
    _inside(root, out / "extra.toml").write_text("version = 2\n" + table.format(name="image-marker"))
    merged = ctd.merged_config(root, "/etc/containerd/config.toml")
    runtimes = merged["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    assert set(runtimes) == {"image-marker"}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("ldcache")
    return standin_store(work / "work", work / "store", V)


def _ldcache(root: Path) -> dict[str, object]:
    r = CliRunner().invoke(main, ["doctor", "--root", str(root), "--check", "ldcache", "--json"])
    return next(c for c in json.loads(r.stdout)["checks"] if c["name"] == "ldcache")


def test_doctor_reads_the_ld_cache_beneath_the_root(store: Path, tmp_path: Path) -> None:
    """The cache file and the paths it lists are the image's: ROOT/etc/ld.so.cache as an absolute
    link to where the image keeps it, and libcuda.so.1 as an absolute link to its file, pass (the
    host, which has no such cache and maybe another driver root, is never asked)."""
    root = tmp_path / "root"
    root.mkdir()
    r = CliRunner().invoke(main, ["install", "--store", str(store), "--driver", V, "--kernel", KERNEL,
                                  "--root", str(root), "--activate"])
    assert r.exit_code == 0, r.output
    assert _ldcache(root)["ok"] is True
    keep = root / "var/cache/ld-image-only"
    keep.mkdir(parents=True)
    shutil.move(root / "etc/ld.so.cache", keep / "ld.so.cache")
    (root / "etc/ld.so.cache").symlink_to("/var/cache/ld-image-only/ld.so.cache")
    assert not Path("/var/cache/ld-image-only").exists()
    lib = root / f"opt/nvidia/{V}/lib64/libcuda.so.1"
    target = lib.resolve()
    lib.unlink()
    lib.symlink_to("/" + str(target.relative_to(root.resolve())))
    check = _ldcache(root)
    assert check["ok"] is True, check
    assert f"libcuda.so.1 -> /opt/nvidia/{V}/lib64/{target.name}" in str(check["message"]), check


def test_a_linked_manifest_is_never_read_through(store: Path, tmp_path: Path) -> None:
    """An image's /opt/nvidia/<v>/manifest.json replaced by a link to a host file (here a JSON file
    with an input digest of its own, which `list --json` would print): the version is no complete
    root any more, and nothing of the host file shows up; the entry points' reader refuses the link
    with one line."""
    root = tmp_path / "root"
    root.mkdir()
    r = CliRunner().invoke(main, ["install", "--store", str(store), "--driver", V, "--kernel", KERNEL,
                                  "--root", str(root)])
    assert r.exit_code == 0, r.output
    host = tmp_path / "host-secret.json"
    host.write_text(json.dumps({"input_digest": "host-secret-digest", "arch": "arm64"}))
    manifest = root / f"opt/nvidia/{V}/manifest.json"
    manifest.unlink()
    manifest.symlink_to(host)
    r = CliRunner().invoke(main, ["list", "--root", str(root), "--json"])
    assert "host-secret-digest" not in r.output, r.output
    from nodeprep.errors import InputError
    from nodeprep.node.entrypoints import _arch

    with pytest.raises(InputError, match="driver manifest"):
        _arch(manifest.parent)


def test_a_fifo_or_link_for_the_supported_gpu_list_is_one_line(store: Path, tmp_path: Path) -> None:
    """An image's supported-GPU list replaced by a FIFO (which a read would wait on forever) or by a
    link to a host file: doctor's support check refuses it with one line naming the file and never
    opens it for reading; the same list as a link is not read through."""
    import os

    root = tmp_path / "root"
    root.mkdir()
    r = CliRunner().invoke(main, ["install", "--store", str(store), "--driver", V, "--kernel", KERNEL,
                                  "--root", str(root), "--activate"])
    assert r.exit_code == 0, r.output
    listed = root / f"opt/nvidia/{V}/share/supported-gpus.json"
    listed.parent.mkdir(parents=True, exist_ok=True)
    listed.unlink(missing_ok=True)
    os.mkfifo(listed)
    r = CliRunner().invoke(main, ["doctor", "--root", str(root), "--check", "support"])
    assert r.exit_code == 2 and r.output.count("error:") == 1, r.output
    assert "supported-gpus.json" in r.output and "Traceback" not in r.output
    listed.unlink()
    host = tmp_path / "host.json"
    host.write_text("host-marker")
    listed.symlink_to(host)
    r = CliRunner().invoke(main, ["doctor", "--root", str(root), "--check", "support"])
    assert r.exit_code == 2 and "host-marker" not in r.output and "symbolic link" in r.output, r.output
