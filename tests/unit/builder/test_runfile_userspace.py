"""The user space made from an NVIDIA `.run` installer's own files (nodeprep.builder.runfileuserspace).

No NVIDIA runfile is reachable from here: the installers are built with Debian's makeself from REAL
files, the user space of 535.309.01 that the slow tier built from Debian's packages (the test cache
holds it; tests/support/makeself.py lays it out as NVIDIA's installers do, with the `.manifest`
nvidia-installer reads). The one stand-in is NVIDIA's download server. Install and doctor run
through the real CLI into a test root, with the stand-in kmod the node tests use.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nodeprep import artifact
from nodeprep.builder import runfileuserspace as rus
from nodeprep.errors import ArtifactError, InputError
from nodeprep.sources import runfile
from tests.support import rawartifact as ra
from tests.support.clirunner import invoke
from tests.support.makeself import MANIFEST_HEADER, debian_userspace, make_runfile, nvidia_tree
from tests.support.standin import KERNEL, standin_kmod

V = "535.309.01"
LABEL = f"NVIDIA Accelerated Graphics Driver for Linux-x86_64 {V}"


def manifest_text(*entries: str, version: str = V) -> str:
    return MANIFEST_HEADER.format(version=version) + "\n".join(entries) + "\n"


ENTRIES = (
    "nvidia-installer 0755 INSTALLER_BINARY",
    f"libcuda.so.{V} 0755 CUDA_LIB NATIVE /",
    f"libcuda.so.1 0755 CUDA_SYMLINK NATIVE / libcuda.so.{V}",
    "libcuda.so 0755 CUDA_SYMLINK NATIVE / libcuda.so.1",
    f"32/libcuda.so.{V} 0755 CUDA_LIB COMPAT32 /",
    f"libnvidia-ml.so.{V} 0755 UTILITY_LIB NATIVE",
    f"libnvidia-ml.so.1 0755 UTILITY_LIB_SYMLINK NATIVE libnvidia-ml.so.{V}",
    f"libGLX_nvidia.so.{V} 0755 GLX_CLIENT_LIB NATIVE",
    "nvidia-smi 0755 UTILITY_BINARY",
    "nvidia-settings 0755 UTILITY_BINARY",
    "nvidia-modprobe 4755 NVIDIA_MODPROBE /usr/bin",
    "firmware/gsp_ga10x.bin 0444 FIRMWARE INHERIT_PATH_DEPTH:1",
    "supported-gpus/supported-gpus.json 0644 DOCUMENTATION share/doc/NVIDIA_GLX-1.0/supported-gpus",
    "kernel/nvidia/nv.c 0644 KERNEL_MODULE_SRC INHERIT_PATH_DEPTH:1",
)


def test_the_manifest_is_read_as_nvidia_installer_reads_it() -> None:
    m = runfile.parse_manifest(manifest_text(*ENTRIES, "", "after-the-empty-line 0644 MANPAGE x"))
    assert (m.description, m.version) == ("NVIDIA Accelerated Graphics Driver for Linux-x86_64", V)
    assert len(m.entries) == len(ENTRIES)  # nvidia-installer stops at the first empty line
    by_file = {e.file: e for e in m.entries}
    assert by_file["libcuda.so.1"] == runfile.ManifestEntry(
        "libcuda.so.1", 0o755, "CUDA_SYMLINK", "NATIVE", "/", f"libcuda.so.{V}")
    assert by_file["libnvidia-ml.so.1"].target == f"libnvidia-ml.so.{V}"
    assert by_file["firmware/gsp_ga10x.bin"].path == "" and by_file["firmware/gsp_ga10x.bin"].mode == 0o444
    assert by_file["nvidia-modprobe"].path == "/usr/bin" and by_file["nvidia-modprobe"].mode == 0o4755
    assert by_file["kernel/nvidia/nv.c"].type == "KERNEL_MODULE_SRC"  # a type the user space does not read


@pytest.mark.parametrize(
    "line, message",
    [
        ("libcuda.so.1 0755", r"line 10: a file line is FILE MODE TYPE"),
        ("../../etc/passwd 0644 FIRMWARE INHERIT_PATH_DEPTH:1",
         r"line 10: '../../etc/passwd' is not a path inside"),
        ("/etc/passwd 0644 DOCUMENTATION share", r"line 10: '/etc/passwd' is not a path inside"),
        ("nvidia-smi rwx UTILITY_BINARY", r"line 10: mode 'rwx' is not octal"),
        (f"libcuda.so.{V} 0755 CUDA_LIB AMD64 /", r"line 10: architecture 'AMD64' is not NATIVE or COMPAT32"),
        ("libcuda.so.1 0755 CUDA_SYMLINK NATIVE /", r"line 10: CUDA_SYMLINK needs arch path target"),
        ("firmware/gsp.bin 0444 FIRMWARE INHERIT_PATH_DEPTH:3", r"line 10: 'INHERIT_PATH_DEPTH:3' is not"),
    ],
)
def test_a_malformed_manifest_line_is_refused_naming_it(line: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        runfile.parse_manifest(manifest_text("nvidia-installer 0755 INSTALLER_BINARY", line), source="x.run")
    with pytest.raises(InputError, match=r"line 2: 'five' is not a driver version"):
        runfile.parse_manifest(manifest_text(version="five"))


def test_the_layout_takes_the_compute_user_space_as_the_manifest_declares_it() -> None:
    placements = rus.plan_layout(runfile.parse_manifest(manifest_text(*ENTRIES)), V, "amd64")
    assert [(p.dest, p.src or f"-> {p.target}") for p in placements] == [
        ("bin/nvidia-modprobe", "nvidia-modprobe"),
        ("bin/nvidia-smi", "nvidia-smi"),
        (f"firmware/nvidia/{V}/gsp_ga10x.bin", "firmware/gsp_ga10x.bin"),
        ("lib64/libcuda.so.1", f"-> libcuda.so.{V}"),
        (f"lib64/libcuda.so.{V}", f"libcuda.so.{V}"),  # the NATIVE one, not 32/
        ("lib64/libnvidia-ml.so.1", f"-> libnvidia-ml.so.{V}"),
        (f"lib64/libnvidia-ml.so.{V}", f"libnvidia-ml.so.{V}"),
        ("share/supported-gpus.json", "supported-gpus/supported-gpus.json"),
    ]
    assert {p.dest: p.mode for p in placements if p.src}["bin/nvidia-modprobe"] == 0o755  # not setuid


def test_a_manifest_of_another_version_or_without_the_required_files_is_refused() -> None:
    mismatch = f"x.run: .manifest is driver 535.216.03, not {V}: the kernel modules and the user space must"
    with pytest.raises(InputError, match=mismatch):
        rus.plan_layout(runfile.parse_manifest(manifest_text(*ENTRIES, version="535.216.03")), V, "amd64",
                        source="x.run")
    without_nvml = [e for e in ENTRIES if not e.startswith("libnvidia-ml")]
    with pytest.raises(InputError, match=f"libnvidia-ml.so.{V} not found in x.run"):
        rus.plan_layout(runfile.parse_manifest(manifest_text(*without_nvml)), V, "amd64", source="x.run")


# ---------------------------------------------------------------------------------------------
# From real files


@pytest.fixture(scope="module")
def debian(test_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the Debian-built user-space artifact of V, its payload extracted)."""
    found = debian_userspace(test_cache, V)
    if found is None:
        pytest.skip(f"no user-space artifact of {V} built from Debian's packages in {test_cache} "
                    "(the slow tier's shared build makes it)")
    payload = tmp_path_factory.mktemp("debian-us")
    artifact.extract(found, payload)
    return found, payload


@pytest.fixture(scope="module")
def installer(debian: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """NVIDIA-Linux-x86_64-V.run made from the real files with makeself (gzip -1: quick to pack)."""
    work = tmp_path_factory.mktemp("installer")
    tree = nvidia_tree(debian[1], work / f"NVIDIA-Linux-x86_64-{V}", V)
    return make_runfile(tree, work / f"NVIDIA-Linux-x86_64-{V}.run", compression="gzip", level=1, label=LABEL)


def test_the_runfile_user_space_has_the_debian_layout_and_is_reproducible(
    debian: tuple[Path, Path], installer: Path, tmp_path: Path
) -> None:
    path, m = rus.build_userspace(installer, V, tmp_path / "a", os_name="debian-12")
    ref = artifact.read_manifest(debian[0])
    assert m.kind == "userspace" and m.driver_version == V and path.name == ref.name
    assert m.inputs == {installer.name: artifact.sha256_file(installer)}
    assert m.extra["source"] == {"kind": "runfile", "name": installer.name}
    assert sorted(m.files) == sorted(ref.files)  # the same relative paths: lib64/, bin/, firmware/, share/
    assert m.files == ref.files  # and the same bytes, modes and soname links (they are the same files)
    assert artifact.verify(path) == []
    again, _ = rus.build_userspace(installer, V, tmp_path / "b", os_name="debian-12")
    assert again.read_bytes() == path.read_bytes()


def test_the_runfile_user_space_installs_and_passes_doctor(installer: Path, tmp_path: Path) -> None:
    store, root = tmp_path / "store", tmp_path / "root"
    us, usm = rus.build_userspace(installer, V, store, os_name="debian-12")
    ra.store_with(store, [(us, usm), standin_kmod(tmp_path / "ko", V, store)])
    (root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)  # a Debian image's tree
    (root / "etc").mkdir()
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    res = invoke("install", "--store", str(store), "--driver", V, "--kernel", KERNEL, "--root", str(root),
                 "--activate")
    assert res.exit_code == 0, res.output
    assert os.readlink(root / "opt/nvidia/current") == V
    assert (root / "opt/nvidia" / V / "lib64" / "libcuda.so.1").resolve().name == f"libcuda.so.{V}"
    done = invoke("doctor", "--root", str(root), "--json", "--check", "state", "--check", "ldcache",
                  "--check", "support")
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert all(c["ok"] and not c.get("skipped") for c in checks.values()), checks
    assert f"libcuda.so.1 -> /opt/nvidia/{V}/lib64/libcuda.so.{V}" in checks["ldcache"]["message"]


def test_a_link_the_manifest_declares_against_the_library_soname_is_refused(
    debian: tuple[Path, Path], tmp_path: Path
) -> None:
    tree = nvidia_tree(debian[1], tmp_path / "tree", V)
    text = (tree / ".manifest").read_text().replace(
        f"libcuda.so.1 0755 CUDA_SYMLINK NATIVE / libcuda.so.{V}",
        f"libcuda.so.1 0755 CUDA_SYMLINK NATIVE / libnvidia-nvvm.so.{V}")
    placements = rus.plan_layout(runfile.parse_manifest(text), V, "amd64")
    with pytest.raises(ArtifactError, match=f"x.run: .manifest links libcuda.so.1 -> libnvidia-nvvm.so.{V}, "
                                            "whose SONAME is libnvidia-nvvm.so.4"):
        rus.layout_payload(tree, tmp_path / "payload", placements, source="x.run")


# ---------------------------------------------------------------------------------------------
# build-driver: an open-source release's kmod with the user space of the runfile of its version


def fake_headers(top: Path) -> Path:
    """A headers tree as --builder host reads it (.config, Makefile, utsrelease.h): enough to plan a
    build, not to compile one (the compile fails at once: nothing is published)."""
    (top / "include/generated").mkdir(parents=True)
    (top / ".config").write_text('CONFIG_CC_VERSION_TEXT="gcc (Debian 12.2.0-14) 12.2.0"\n')
    (top / "Makefile").write_text("all:\n")
    (top / "include/generated/utsrelease.h").write_text(f'#define UTS_RELEASE "{KERNEL}"\n')
    return top


@pytest.mark.parametrize("manifest_version", ["580.142", "595.45.04"])
def test_open_source_kmod_takes_the_runfile_user_space_of_its_version_only(
    tmp_path: Path, manifest_version: str
) -> None:
    """--open-source + --runfile of the same version (the installer's name and label say 580.142):
    the user space is made from the runfile before the compile; an installer whose own .manifest is
    another version is refused (exit 2) before anything is compiled or published."""
    import hashlib

    from tests.unit.join.conftest import build_payload
    from tests.unit.sources.test_opensource import release_members, write_tgz

    release = write_tgz(tmp_path / "open-gpu-kernel-modules-580.142.tar.gz", release_members())
    payload = build_payload(tmp_path / "us", "580.142")  # real shared objects with NVIDIA's sonames
    tree = nvidia_tree(payload, tmp_path / "NVIDIA-Linux-x86_64-580.142", "580.142",
                       manifest_version=manifest_version)
    run = make_runfile(tree, tmp_path / "NVIDIA-Linux-x86_64-580.142.run", compression="gzip",
                       label="NVIDIA Accelerated Graphics Driver for Linux-x86_64 580.142")
    store, cache = tmp_path / "store", tmp_path / "cache"
    res = invoke("build-driver", "--builder", "host", "--headers-dir", str(fake_headers(tmp_path / "h")),
                 "--flavour", "open", "--store", str(store), "--cache", str(cache), "--no-smoke-test",
                 "--open-source", str(release), "--open-source-sha256",
                 hashlib.sha256(release.read_bytes()).hexdigest(),
                 "--runfile", str(run), "--sha256", hashlib.sha256(run.read_bytes()).hexdigest())
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error: ")]
    assert "Traceback" not in res.output and not store.exists()
    made = cache / "userspace" / "runfile" / "nvidia-userspace-580.142-amd64.tar.zst"
    # not where the Debian-built user space of that version is cached: neither replaces the other
    assert not (cache / "userspace" / made.name).exists()
    if manifest_version == "580.142":
        assert res.exit_code == 1 and errors[0].startswith("error: compiling the modules failed"), res.output
        m = artifact.read_manifest(made)
        assert m.inputs == {run.name: hashlib.sha256(run.read_bytes()).hexdigest()}
        assert m.files["lib64/libcuda.so.1"].target == "libcuda.so.580.142"
    else:
        assert res.exit_code == 2, res.output
        assert errors == [f"error: {run.name}: .manifest is driver 595.45.04, not 580.142: the kernel "
                          "modules and the user space must be the same version"]
        assert not made.exists() and not (cache / "kmod-builds").exists()  # nothing compiled


def test_fabric_manager_goes_into_the_runfile_user_space(installer: Path, tmp_path: Path) -> None:
    """NVIDIA's Fabric Manager archive packed in its real layout around stand-in binaries
    (tests/support/fmarchive.py) beside the installer: its files and record in the artifact, the
    archive an input; the root installs and passes doctor."""
    from nodeprep.builder import fabricmanager
    from tests.support import fmarchive

    archive = fmarchive.pack(tmp_path / "fm", V)
    fm = fabricmanager.read_archive(archive, artifact.sha256_file(archive), V, "amd64")
    store, root = tmp_path / "store", tmp_path / "root"
    us, usm = rus.build_userspace(installer, V, store, os_name="debian-12", fabricmanager=fm)
    assert usm.extra["fabricmanager"]["version"] == V and usm.inputs[archive.name] == fm.sha256
    assert {"bin/nv-fabricmanager", "lib64/libnvfm.so.1", "share/nvidia/nvswitch/fabricmanager.cfg"} <= set(
        usm.files)
    ra.store_with(store, [(us, usm), standin_kmod(tmp_path / "ko", V, store)])
    (root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    (root / "etc").mkdir()
    res = invoke("install", "--store", str(store), "--driver", V, "--kernel", KERNEL, "--root", str(root),
                 "--activate")
    assert res.exit_code == 0, res.output
    assert (root / "opt/nvidia" / V / "bin/nv-fabricmanager").is_file()
    assert (root / "etc/systemd/system/nodeprep-fabricmanager.service").is_file()
