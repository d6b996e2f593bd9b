"""Hostile artifacts are refused with nothing written outside the staging directory (which is removed),
and concurrent runs serialize on the node lock (observed with real processes)."""

from __future__ import annotations

import fcntl
import io
import json
import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
import zstandard

from nodeprep import artifact
from nodeprep.node.state import load_state
from tests.support.httpdir import serve_directory

from .helpers import V_NEW, V_OLD, NodeStore, cli, install_cli, popen

pytestmark = pytest.mark.slow

EVIL_VERSION = "535.999.01"


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under root (links not followed) with its size and mode, minus the lock file."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if rel == "var/lib/nodeprep/lock":
                continue
            st = p.lstat()
            out[rel] = (st.st_size, st.st_mode)
    return out


def hostile_tar(dest: Path, evil: tarfile.TarInfo, data: bytes = b"") -> Path:
    """A userspace artifact whose manifest is valid, with one legitimate file and then `evil`."""
    good = b"\x7fELF-not-really"
    manifest = artifact.Manifest(
        kind="userspace",
        driver_version=EVIL_VERSION,
        arch="amd64",
        os="debian-12",
        input_digest="a" * 64,
        inputs={},
        files={
            "lib64/libok.so.1": artifact.FileEntry(artifact.sha256_bytes(good), len(good), 0o644),
            evil.name.rstrip("/"): artifact.FileEntry(artifact.sha256_bytes(data), len(data), 0o644),
        },
    )
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as t:
        for name, payload in (("manifest.json", manifest.to_json()), ("lib64/libok.so.1", good)):
            ti = tarfile.TarInfo(name)
            ti.size = len(payload)
            t.addfile(ti, io.BytesIO(payload))
        evil.size = len(data) if evil.isreg() else 0
        t.addfile(evil, io.BytesIO(data) if evil.isreg() else None)
    dest.write_bytes(zstandard.ZstdCompressor().compress(raw.getvalue()))
    return dest


def member(
    name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "", mode: int = 0o644, devmajor: int = 0
) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type, ti.linkname, ti.mode, ti.devmajor = kind, linkname, mode, devmajor
    return ti


def evil_entry(path: Path, kind: str, input_digest: str, **extra: str) -> artifact.IndexEntry:
    """The store index entry of an EVIL_VERSION artifact at `path` (its real sha256 and size)."""
    return artifact.IndexEntry(
        name=path.name,
        kind=kind,
        driver_version=EVIL_VERSION,
        arch="amd64",
        os="debian-12",
        sha256=artifact.sha256_file(path),
        size=path.stat().st_size,
        input_digest=input_digest,
        **extra,
    )


def cases(outside: Path) -> dict[str, tarfile.TarInfo]:
    return {
        "absolute": member(str(outside / "absolute")),
        "dotdot": member("lib64/../../../../../../../../" + str(outside / "dotdot").lstrip("/")),
        "link-outside": member("lib64/evil", tarfile.SYMTYPE, linkname=str(outside / "link")),
        "link-dotdot": member("lib64", tarfile.SYMTYPE, linkname="../../../../../../../../tmp"),
        "hardlink": member("bin/passwd", tarfile.LNKTYPE, linkname="/etc/passwd"),
        "device": member("bin/mem", tarfile.CHRTYPE, devmajor=1),
        "fifo": member("bin/fifo", tarfile.FIFOTYPE),
        "setuid": member("bin/nvidia-modprobe", mode=0o4755),
    }


@pytest.mark.parametrize(
    "kind", ["absolute", "dotdot", "link-outside", "link-dotdot", "hardlink", "device", "fifo", "setuid"]
)
def test_hostile_userspace_artifact_is_refused(
    kind: str, node_store: NodeStore, rootfs: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    store = artifact.LocalStore(tmp_path / "store")
    store.path.mkdir()
    bad = hostile_tar(
        tmp_path / f"nvidia-userspace-{EVIL_VERSION}-amd64.tar.zst", cases(outside)[kind], data=b"pwned\n"
    )
    kmod_src = node_store.path / f"nvidia-kmod-{V_NEW}-proprietary-{node_store.kernel}.tar.zst"
    kmod = tmp_path / f"nvidia-kmod-{EVIL_VERSION}-proprietary-{node_store.kernel}.tar.zst"
    kmod.write_bytes(kmod_src.read_bytes())
    entries = [
        evil_entry(bad, "userspace", "a" * 64),
        evil_entry(kmod, "kmod", "b" * 64, flavour="proprietary", kernel_release=node_store.kernel),
    ]
    for p in (bad, kmod):
        os.replace(p, store.path / p.name)
    (store.path / "index.json").write_bytes(artifact.render_index(entries))
    before = snapshot(rootfs)
    r = install_cli(store.path, EVIL_VERSION, node_store.kernel, rootfs)
    assert r.returncode == 2, r.stderr  # a refused input (nodeprep/errors.py)
    error = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and ("unsafe member" in error[0] or "points outside the artifact" in error[0]), (
        r.stderr
    )
    assert list(outside.iterdir()) == []
    assert not Path("/tmp/pwned").exists()
    after = snapshot(rootfs)
    new = sorted(set(after) - set(before))
    # only the node's own bookkeeping directories may appear; nothing from the artifact, no staging left
    assert all(p in ("opt/nvidia", "var/lib/nodeprep") for p in new), new
    assert {k: v for k, v in after.items() if k in before} == before


def test_user_space_without_nvml_is_refused_and_the_old_version_stays(
    node_store: NodeStore, rootfs: Path, tmp_path: Path
) -> None:
    """Issue 18: the real user space of V_NEW repacked without libnvidia-ml.so.* (and its soname link)
    was installed and activated, after which nvidia-smi exited 12. `install --activate` now refuses
    it (exit 2, one line naming what is missing) and V_OLD, active before, stays active."""
    store = tmp_path / "store"
    store.mkdir()
    src = node_store.path / f"nvidia-userspace-{V_NEW}-amd64.tar.zst"
    payload = tmp_path / "payload"
    payload.mkdir()
    manifest = artifact.extract(src, payload)
    (payload / artifact.MANIFEST).unlink()
    dropped = sorted(p.name for p in (payload / "lib64").glob("libnvidia-ml.so*"))
    assert f"libnvidia-ml.so.{V_NEW}" in dropped
    for name in dropped:
        (payload / "lib64" / name).unlink()
    us, us_manifest = artifact.pack(payload, manifest, store)
    kmod_name = f"nvidia-kmod-{V_NEW}-proprietary-{node_store.kernel}.tar.zst"
    (store / kmod_name).write_bytes((node_store.path / kmod_name).read_bytes())
    artifact.LocalStore(store).publish(us, us_manifest)
    artifact.LocalStore(store).publish(store / kmod_name, artifact.read_manifest(store / kmod_name))

    r = install_cli(node_store.path, V_OLD, node_store.kernel, rootfs, "--activate")
    assert r.returncode == 0, r.stderr
    before = snapshot(rootfs)
    r = install_cli(store, V_NEW, node_store.kernel, rootfs, "--activate")
    assert r.returncode == 2, r.stderr
    error = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and "Traceback" not in r.stderr, r.stderr
    assert error[0].startswith(f"error: driver {V_NEW}: incomplete user space, refusing to install it: ")
    assert f"lib64/libnvidia-ml.so.{V_NEW} is missing" in error[0]
    assert f"the ld cache does not resolve libnvidia-ml.so.1 into /opt/nvidia/.staging-{V_NEW}-" in error[0]
    assert snapshot(rootfs) == before
    assert os.readlink(rootfs / "opt/nvidia/current") == V_OLD
    assert subprocess.run(["chroot", str(rootfs), "/opt/nvidia/current/bin/nvidia-smi"]).returncode == 9


def test_checksum_mismatch_against_the_index(node_store: NodeStore, rootfs: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    entries = []
    for e in artifact.LocalStore(node_store.path).entries():
        if e.driver_version != V_NEW:
            continue
        (store / e.name).write_bytes((node_store.path / e.name).read_bytes())
        entries.append(e if e.kind == "kmod" else artifact.IndexEntry(**{**e.__dict__, "sha256": "0" * 64}))
    (store / "index.json").write_bytes(artifact.render_index(entries))
    r = install_cli(store, V_NEW, node_store.kernel, rootfs)
    assert r.returncode == 2 and "does not match the store index" in r.stderr
    assert not (rootfs / "opt/nvidia" / V_NEW).exists()


def test_concurrent_runs_serialize(node_store: NodeStore, rootfs: Path) -> None:
    """1) The test holds the node lock itself (a real flock on ROOT/var/lib/nodeprep/lock): an install
    started meanwhile waits, says so, and changes nothing until the lock is released.
    2) An install and an activation started while the lock is held both wait; once it is released
    they run one after the other (never together) and both succeed with a consistent state."""
    lock = rootfs / "var/lib/nodeprep/lock"
    lock.parent.mkdir(parents=True)
    args = ("--store", str(node_store.path), "--kernel", node_store.kernel, "--root", str(rootfs))
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("4242\n")
        held.flush()
        proc = popen("install", "--driver", V_OLD, *args)
        time.sleep(3)
        assert proc.poll() is None  # still waiting
        assert not (rootfs / "opt/nvidia" / V_OLD).exists()
        fcntl.flock(held, fcntl.LOCK_UN)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "waiting for another nodeprep run (pid 4242)" in err
    assert (rootfs / "opt/nvidia" / V_OLD / "manifest.json").is_file()

    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        a = popen("install", "--driver", V_NEW, "--activate", *args, "--json")
        b = popen("activate", V_OLD, "--root", str(rootfs), "--json")
        early = {}
        for name, p in (("a", a), ("b", b)):  # each blocks on the held lock and says so first
            lines = []
            while not any("waiting for another nodeprep run" in line for line in lines):
                line = p.stderr.readline()
                assert line, (name, lines)  # exited without waiting
                lines.append(line)
            early[name] = "".join(lines)
        assert not (rootfs / "opt/nvidia" / V_NEW).exists()  # nothing ran while the lock was held
        fcntl.flock(held, fcntl.LOCK_UN)
    (out_a, err_a), (out_b, err_b) = a.communicate(timeout=300), b.communicate(timeout=300)
    assert a.returncode == 0 and b.returncode == 0, (early, err_a, err_b)
    # they ran one after the other: the later one's "was" names what the earlier one activated
    res_a, res_b = json.loads(out_a), json.loads(out_b)
    act_a = res_a.get("activation", res_a)
    first, second = (act_a, res_b) if res_b.get("previous") == act_a.get("version") else (res_b, act_a)
    assert second["previous"] == first["version"], (res_a, res_b)
    active = second["version"]  # whichever ran second decided the active version
    listed = json.loads(cli("list", "--root", str(rootfs), "--json").stdout)
    assert listed["active"] == active and sorted(listed["installed"]) == sorted([V_NEW, V_OLD])


def test_install_from_http_store(node_store: NodeStore, rootfs: Path) -> None:
    """The same store served over HTTP by a loopback server this test starts."""
    with serve_directory(node_store.path) as url:
        r = install_cli(url, V_NEW, node_store.kernel, rootfs, "--activate", "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["changed"] is True
        assert (rootfs / "opt/nvidia" / V_NEW / "lib64" / f"libcuda.so.{V_NEW}").is_file()
        assert list((rootfs / "var/cache/nodeprep").iterdir()) == []  # downloads dropped after install
        gone = url + "/missing"
        r = install_cli(gone, V_OLD, node_store.kernel, rootfs)  # needs the store: fails cleanly
        assert r.returncode == 2 and "HTTP 404" in r.stderr and "Traceback" not in r.stderr
        assert not (rootfs / "opt/nvidia" / V_OLD).exists()
        r = install_cli(gone, V_NEW, node_store.kernel, rootfs, "--json")  # installed: not read
        assert r.returncode == 0, r.stderr
        done = json.loads(r.stdout)
        assert not done["installed_userspace"] and not done["installed_kmod"]
        assert "the store was not read" in " ".join(done["notes"])
        # its one change: the kernel hook's record names the store given (see test_node_install)
        assert done["changed"] is True and load_state(rootfs).kernel_hook["store"] == gone
