"""CDI spec from an installed driver root, validated against the CDI schema nodeprep ships.

The driver root is made by the real artifact pack/extract code plus `ldconfig -n` (conftest.py);
the GPU list comes from real `nvidia-smi -q -x` captures (no GPU here) or from a procfs/sysfs tree
written the way the driver and kernel lay them out.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from nodeprep.errors import StateError
from nodeprep.profile import Driver, Runtime
from nodeprep.runtime import cdi, gpus
from nodeprep.runtime.files import apply_changes
from nodeprep.runtime.hookprogram import HOOK_PATH, MODULES_PATH

from .conftest import FIXTURES, VERSION

DRIVER = Driver(version=VERSION)
LIB_DIR = "/usr/lib/x86_64-linux-gnu"
SCHEMA = json.loads(cdi.SCHEMA_PATH.read_text())


def _spec(root: Path, fixture: str, driver: Driver = DRIVER) -> dict:  # type: ignore[type-arg]
    gpu_list = gpus.from_nvidia_smi_xml((FIXTURES / fixture).read_bytes())
    changes = cdi.plan_cdi(root, driver, Runtime(), gpu_list)
    # the program (its modules first) before the spec that names it
    assert [c.target for c in changes] == [MODULES_PATH, HOOK_PATH, "/etc/cdi/nvidia.yaml"]
    apply_changes(changes)
    return yaml.safe_load((root / "etc/cdi/nvidia.yaml").read_text())


def test_spec_is_valid_and_names_devices_like_nvidia_ctk(node_root: Path) -> None:
    spec = _spec(node_root, "dual-rtx-a5000_590.44.01.xml")
    jsonschema.Draft7Validator(SCHEMA).validate(spec)
    assert cdi.spec_problems(spec) == []
    assert spec["cdiVersion"] == "0.5.0" and spec["kind"] == "nvidia.com/gpu"
    nodes = {d["name"]: [n["path"] for n in d["containerEdits"]["deviceNodes"]] for d in spec["devices"]}
    # NVML index 0 is the GPU at 81:00.0, whose device minor is 1 (the capture says so)
    assert nodes == {
        "0": ["/dev/nvidia1"],
        "GPU-12345678-aaaa-bbbb-cccc-0123456789ab": ["/dev/nvidia1"],
        "1": ["/dev/nvidia0"],
        "GPU-12345678-aaaa-bbbb-cccc-0123456789cd": ["/dev/nvidia0"],
        "all": ["/dev/nvidia1", "/dev/nvidia0"],
    }
    edits = spec["containerEdits"]
    assert [n["path"] for n in edits["deviceNodes"]] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
    ]
    # no nvidia-cdi-hook on this node: nodeprep's own hook checks NVIDIA_REQUIRE_* and rebuilds the
    # image's ld cache when that cache names another copy of a mounted library
    (hook,) = edits["hooks"]
    # the program nodeprep writes on the node (its own python3), never this checkout or its venv
    assert hook["hookName"] == "createContainer" and hook["path"] == HOOK_PATH
    assert hook["args"][0] == "cdi-hook" and not any("sys.path" in a for a in hook["args"])
    assert hook["args"][1:7] == ["--driver", VERSION, "--ldconfig", "/usr/lib/x86_64-linux-gnu",
                                 "--libraries", f"/opt/nvidia/{VERSION}/lib64"]
    assert "annotations" not in spec  # needs cdiVersion 0.6.0; podman 4.3 refuses the spec with it


def test_mounts_point_at_the_versioned_driver_root(node_root: Path) -> None:
    spec = _spec(node_root, "tesla-t4_515.105.01.xml")
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    base = f"/opt/nvidia/{VERSION}"
    # the versioned library folder, once, at its node path: no file of it mounted by name into the
    # loader's directories (nodeprep's hook links the names there: tests/unit/containerhooks)
    assert mounts[f"{base}/lib64"] == f"{base}/lib64"
    assert not any(m.startswith("/usr/lib") for m in mounts), mounts
    args = spec["containerEdits"]["hooks"][0]["args"]
    links = [args[i + 1] for i, a in enumerate(args) if a == "--link"]
    # every real file, every soname link (from the artifact, or made by ldconfig -n) and the
    # unversioned name applications dlopen, which no soname link gives (named by its soname link)
    assert {f"libcuda.so.{VERSION}", "libcuda.so.1", "libnvidia-ml.so.1", "libcuda.so=libcuda.so.1"} \
        <= set(links)
    assert not any(link.startswith("libnvidia-ml.so=") for link in links)  # not a name create-symlinks makes
    for link in links:  # each names an entry of the mounted folder
        assert (node_root / base.lstrip("/") / "lib64" / link.rpartition("=")[2]).is_file(), link
    folder, named = cdi.library_links(spec)  # how the GPU machine's scripts read them
    assert folder == f"{base}/lib64" and len(named) == len(links)
    assert named["libcuda.so"] == "libcuda.so.1" and named["libcuda.so.1"] == "libcuda.so.1"
    assert mounts["/usr/bin/nvidia-smi"] == f"{base}/bin/nvidia-smi"
    # the GSP firmware where the driver inside a container looks (as nvidia-ctk mounts it)
    fw = f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin"
    assert mounts[fw] == f"{base}/firmware/nvidia/{VERSION}/gsp_ga10x.bin"
    for host in mounts.values():  # every mount source exists in the installed root
        assert (node_root / host.lstrip("/")).exists()
    assert all(
        m["options"] == ["ro", "nosuid", "nodev", "rbind", "rprivate"]
        for m in spec["containerEdits"]["mounts"]
    )
    assert spec["containerEdits"]["hooks"][0]["args"][1:3] == ["--driver", VERSION]


def test_a100_capture_lists_one_of_four_gpus(node_root: Path) -> None:
    """The A100 capture says attached_gpus 4 but holds one <gpu> (see fixtures SOURCES.md)."""
    found = gpus.from_nvidia_smi_xml((FIXTURES / "a100-sxm4-80gb-mig_535.54.03.xml").read_bytes())
    assert "reports 4 attached GPUs but lists 1" in found.warnings[0]
    spec = _spec(node_root, "a100-sxm4-80gb-mig_535.54.03.xml")
    names = [d["name"] for d in spec["devices"]]
    assert names == ["0", "GPU-513536b6-7d19-9063-b049-1e69664bb298", "all"]
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia1"}]  # minor 1
    jsonschema.Draft7Validator(SCHEMA).validate(spec)


def test_modules_decide_common_device_nodes(node_root: Path) -> None:
    spec = _spec(node_root, "a10g_515.105.01.xml", Driver(version=VERSION, modules=("nvidia",)))
    assert [n["path"] for n in spec["containerEdits"]["deviceNodes"]] == ["/dev/nvidiactl"]


def test_toolkit_hooks_do_only_what_nodeprep_does_not(node_root: Path) -> None:
    hook = node_root / "usr/local/bin/nvidia-cdi-hook"  # found anywhere on the node's PATH
    hook.parent.mkdir(parents=True)
    hook.write_bytes(b"\x7fELF")
    (node_root / "proc/driver/nvidia").mkdir(parents=True)
    (node_root / "proc/driver/nvidia/params").write_text("ModifyDeviceFiles: 1\n")
    spec = _spec(node_root, "a10g_515.105.01.xml")
    (ours,) = spec["containerEdits"]["hooks"]
    multiarch = "/usr/lib/x86_64-linux-gnu"
    # no create-symlinks: nodeprep's hook makes every link, libcuda.so included; no enable-cuda-compat
    # of its own: nodeprep's hook runs it for an image with CUDA compat libraries only; no
    # disable-device-node-modification of its own: nodeprep's hook becomes it when done (one process);
    # its ld cache fast path kept: no update-ldcache (an ldconfig per start)
    assert ours["args"][1:8] == ["--driver", VERSION, "--ldconfig", multiarch,
                                 "--nvidia-cdi-hook", "/usr/local/bin/nvidia-cdi-hook",
                                 "--disable-device-node-modification"]
    assert "libcuda.so=libcuda.so.1" in ours["args"]
    assert cdi.spec_problems(spec) == []


def test_profile_names_the_toolkit_hook_and_activation_keeps_it(node_root: Path) -> None:
    path = "/opt/nvidia-toolkit/bin/nvidia-cdi-hook"  # not on the PATH
    (node_root / path.lstrip("/")).parent.mkdir(parents=True)
    (node_root / path.lstrip("/")).write_bytes(b"\x7fELF")
    gpu_list = gpus.from_nvidia_smi_xml((FIXTURES / "a10g_515.105.01.xml").read_bytes())
    assert cdi.build_spec(node_root, DRIVER, gpu_list)["containerEdits"]["hooks"][0]["path"] != path
    apply_changes(cdi.plan_cdi(node_root, DRIVER, Runtime(cdi_hook_path=path), gpu_list))
    spec_file = node_root / "etc/cdi/nvidia.yaml"
    (hook,) = yaml.safe_load(spec_file.read_text())["containerEdits"]["hooks"]
    assert hook["args"][5:7] == ["--nvidia-cdi-hook", path]  # for enable-cuda-compat
    spec_file.write_text(spec_file.read_text().replace(LIB_DIR, "/x"))  # an outdated spec
    assert cdi.refresh_after_activation(node_root, VERSION) == ["/etc/cdi/nvidia.yaml"]
    (hook,) = yaml.safe_load(spec_file.read_text())["containerEdits"]["hooks"]
    assert hook["args"][3:7] == ["--ldconfig", LIB_DIR, "--nvidia-cdi-hook", path]  # kept by the rewrite


def test_present_nodes_and_sockets_are_in_the_spec(node_root: Path, tmp_path: Path) -> None:
    """/dev/nvidia-modeset, MIG's /dev/nvidia-caps nodes and the daemons' sockets when present
    under the device root, which may differ from the driver root (image builds)."""
    dev_root = tmp_path / "devroot"
    for path in ("dev/nvidia-modeset", "dev/nvidia-caps/nvidia-cap1", "dev/nvidia-caps/nvidia-cap12",
                 "dev/nvidia-caps/nvidia-cap2", "run/nvidia-persistenced/socket",
                 "dev/nvidia-caps/nvidia-cap3\n", "dev/nvidia-caps/nvidia-capx"):  # last two: not the driver
        (dev_root / path).parent.mkdir(parents=True, exist_ok=True)
        (dev_root / path).write_text("")
    (dev_root / "tmp/nvidia-mps").mkdir(parents=True)
    gpu_list = gpus.from_nvidia_smi_xml((FIXTURES / "a10g_515.105.01.xml").read_bytes())
    driver = Driver(version=VERSION, modules=("nvidia",))
    plain = cdi.build_spec(node_root, driver, gpu_list)
    assert [n["path"] for n in plain["containerEdits"]["deviceNodes"]] == ["/dev/nvidiactl"]
    assert not any(m["containerPath"].startswith(("/run", "/tmp")) for m in plain["containerEdits"]["mounts"])

    spec = cdi.build_spec(node_root, driver, gpu_list, dev_root=dev_root)
    edits = spec["containerEdits"]
    assert [n["path"] for n in edits["deviceNodes"]] == ["/dev/nvidiactl", "/dev/nvidia-modeset"]
    (everything,) = [d for d in spec["devices"] if d["name"] == "all"]
    assert [n["path"] for n in everything["containerEdits"]["deviceNodes"]] == [
        "/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2",
        "/dev/nvidia-caps/nvidia-cap12"]
    ipc = [m for m in edits["mounts"] if m["containerPath"].startswith(("/run", "/tmp"))]
    assert ipc == [
        {"hostPath": p, "containerPath": p, "options": ["nosuid", "nodev", "rbind", "rprivate", "noexec"]}
        for p in ("/run/nvidia-persistenced/socket", "/tmp/nvidia-mps")]
    assert cdi.spec_problems(spec) == []


def test_second_run_changes_nothing(node_root: Path) -> None:
    _spec(node_root, "a10g_515.105.01.xml")
    before = (node_root / "etc/cdi/nvidia.yaml").read_bytes()
    again = cdi.plan_cdi(
        node_root,
        DRIVER,
        Runtime(),
        gpus.from_nvidia_smi_xml((FIXTURES / "a10g_515.105.01.xml").read_bytes()),
    )
    assert not any(c.changed for c in again) and again[-1].content == before


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        pytest.param(lambda s: s["devices"][0].update(name="gpu 0"), "devices.0.name", id="name-space"),
        pytest.param(lambda s: s.update(kind="nvidia"), "kind", id="kind-no-slash"),
        pytest.param(
            lambda s: s["containerEdits"]["mounts"][0].update(hostPath="opt/x"),
            "containerEdits.mounts.0.hostPath",
            id="relative-path",
        ),
        pytest.param(lambda s: s.update(devices=[]), "devices", id="no-devices"),
        pytest.param(lambda s: s["devices"].append(dict(s["devices"][0])), "devices", id="duplicate-name"),
        pytest.param(
            lambda s: s["containerEdits"].update(deviceNode=[]), "containerEdits", id="unknown-field"
        ),
    ],
)
def test_schema_catches_bad_specs(node_root: Path, mutate, where: str) -> None:  # type: ignore[no-untyped-def]
    spec = _spec(node_root, "a10g_515.105.01.xml")
    mutate(spec)
    problems = cdi.spec_problems(spec)
    assert problems and any(p.startswith(where) for p in problems), problems


@pytest.mark.parametrize(
    ("mutate", "needs"),
    [
        # the mismatch podman 4.3 hit: `annotations` with cdiVersion 0.5.0 ("json: unknown field")
        pytest.param(lambda s: s.update(annotations={"nodeprep.dev/driver-version": VERSION}),
                     "annotations needs cdiVersion >= 0.6.0", id="annotations"),
        pytest.param(lambda s: s["devices"][0].update(annotations={"a": "b"}),
                     "annotations needs cdiVersion >= 0.6.0", id="device-annotations"),
        pytest.param(lambda s: s.update(kind="nvidia.com/gpu.x"),
                     "'.' in the kind's class needs cdiVersion >= 0.6.0", id="dot-in-class"),
        pytest.param(lambda s: s["containerEdits"].update(additionalGids=[44]),
                     "additionalGids needs cdiVersion >= 0.7.0", id="additional-gids"),
        pytest.param(lambda s: s.update(cdiVersion="0.4.0"),
                     "device names starting with a digit needs cdiVersion >= 0.5.0", id="digit-names"),
        pytest.param(lambda s: s.update(cdiVersion="0.9.0"), "'0.9.0' is not a released CDI version",
                     id="unknown-version"),
    ],
)
def test_version_check_catches_fields_newer_than_the_declared_cdi_version(
    node_root: Path, mutate, needs: str  # type: ignore[no-untyped-def]
) -> None:
    spec = _spec(node_root, "a10g_515.105.01.xml")
    assert cdi.cdi_version_problems(spec) == []
    mutate(spec)
    jsonschema.Draft7Validator(SCHEMA).validate(spec)  # the schema alone lets these through
    problems = cdi.spec_problems(spec)
    assert any(p.startswith("cdiVersion: ") and needs in p for p in problems), problems
    with pytest.raises(StateError, match="generated CDI spec is invalid: cdiVersion"):
        cdi.render_spec(spec)


def test_features_with_a_later_declared_version_are_fine(node_root: Path) -> None:
    spec = _spec(node_root, "a10g_515.105.01.xml")
    spec.update(cdiVersion="0.6.0", annotations={"a": "b"})
    assert cdi.spec_problems(spec) == []
    assert cdi.cdi_features(spec) == [
        ("0.5.0", "device names starting with a digit"),
        ("0.6.0", "annotations"),
    ]


def test_render_refuses_an_invalid_spec_it_would_write(node_root: Path) -> None:
    """Every spec that would be written is schema-checked (a re-run whose bytes equal the file
    already there skips the check: that file was checked when it was written)."""
    good = _spec(node_root, "a10g_515.105.01.xml")
    written = cdi.render_spec(good)
    assert cdi.render_spec(good, on_disk=written) == written
    bad = _spec(node_root, "a10g_515.105.01.xml")
    bad.update(devices=[])
    for on_disk in (None, written):
        with pytest.raises(StateError, match="generated CDI spec is invalid: devices"):
            cdi.render_spec(bad, on_disk=on_disk)


def test_no_active_driver(tmp_path: Path) -> None:
    gpu_list = gpus.from_nvidia_smi_xml((FIXTURES / "a10g_515.105.01.xml").read_bytes())
    with pytest.raises(StateError, match="/opt/nvidia/current does not exist"):
        cdi.plan_cdi(tmp_path, DRIVER, Runtime(), gpu_list)


def test_incomplete_driver_root(node_root: Path) -> None:
    (node_root / f"opt/nvidia/{VERSION}/bin/nvidia-smi").unlink()
    gpu_list = gpus.from_nvidia_smi_xml((FIXTURES / "a10g_515.105.01.xml").read_bytes())
    with pytest.raises(StateError, match="missing 1 file"):
        cdi.plan_cdi(node_root, DRIVER, Runtime(), gpu_list)


def test_no_gpus(node_root: Path) -> None:
    with pytest.raises(StateError, match="no NVIDIA GPUs found"):
        cdi.plan_cdi(node_root, DRIVER, Runtime(), gpus.discover(node_root))


def test_gpus_from_driver_procfs(tmp_path: Path) -> None:
    """/proc/driver/nvidia/gpus/<bus>/information as the driver writes it (fields abridged)."""
    for bus, minor, uuid in (("0000:c1:00.0", 0, "GPU-cd"), ("0000:81:00.0", 1, "GPU-ab")):
        d = tmp_path / "proc/driver/nvidia/gpus" / bus
        d.mkdir(parents=True)
        (d / "information").write_text(
            f"Model: \t\t NVIDIA RTX A5000\nIRQ:   \t\t 150\nGPU UUID: \t {uuid}\n"
            f"Video BIOS: \t 94.02.5c.00.01\nBus Type: \t PCIe\nDevice Minor: \t {minor}\n"
        )
    found = gpus.discover(tmp_path)
    assert found.source == "procfs"
    assert found.gpus == (
        gpus.GpuDevice(0, 1, "GPU-ab", "0000:81:00.0"),
        gpus.GpuDevice(1, 0, "GPU-cd", "0000:c1:00.0"),
    )


def test_gpus_from_pci_sysfs_warn(tmp_path: Path) -> None:
    for bus, vendor, cls in (
        ("0000:00:02.0", "0x8086", "0x030000"),
        ("0000:17:00.0", "0x10de", "0x030200"),
        ("0000:18:00.0", "0x10de", "0x040300"),
    ):
        d = tmp_path / "sys/bus/pci/devices" / bus
        d.mkdir(parents=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(cls + "\n")
    found = gpus.discover(tmp_path)
    assert found.source == "pci" and found.gpus == (gpus.GpuDevice(0, 0, None, "0000:17:00.0"),)
    assert "minors assumed to follow PCI order" in found.warnings[0]


def test_activation_rewrites_the_spec_for_the_new_version(node_root: Path, tmp_path: Path) -> None:
    """`nodeprep activate` (the real node code) switches /opt/nvidia/current; the CDI spec nodeprep
    wrote must follow, or containers would get the old version's libraries."""
    from nodeprep.join.activation import CALLBACKS
    from nodeprep.node import switch

    from .conftest import install_driver

    old = _spec(node_root, "dual-rtx-a5000_590.44.01.xml")
    new_version = "535.216.03"
    install_driver(node_root, tmp_path / "work2", new_version)
    (node_root / "opt/nvidia/current").unlink()
    (node_root / "opt/nvidia/current").symlink_to(VERSION)
    (node_root / "var").mkdir()
    (node_root / "var/run").symlink_to("/run")  # as in a real Debian image: absolute, out of --root
    foreign = node_root / "run/cdi/nvidia.yaml"
    foreign.parent.mkdir(parents=True)
    foreign.write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n")  # not ours: untouched
    program = node_root / HOOK_PATH.lstrip("/")
    program.write_text("#!/bin/sh\n# the hook of an older nodeprep\n")

    result = switch.activate(node_root, new_version, load=False, callbacks=CALLBACKS)
    assert program.read_bytes().startswith(b"#!/usr/bin/python3 -IS\n")  # this nodeprep's hook follows
    assert result.changed and "/etc/cdi/nvidia.yaml now mounts 535.216.03" in result.notes
    spec = yaml.safe_load((node_root / "etc/cdi/nvidia.yaml").read_text())
    jsonschema.Draft7Validator(SCHEMA).validate(spec)
    hosts = [m["hostPath"] for m in spec["containerEdits"]["mounts"]]
    assert hosts and all(h.startswith(f"/opt/nvidia/{new_version}/") for h in hosts)
    assert f"/opt/nvidia/{new_version}/lib64" in hosts
    assert spec["devices"] == old["devices"]
    assert spec["containerEdits"]["deviceNodes"] == old["containerEdits"]["deviceNodes"]
    args = spec["containerEdits"]["hooks"][0]["args"]
    assert args[1:3] == ["--driver", new_version]
    assert args[args.index("--libraries") + 1] == f"/opt/nvidia/{new_version}/lib64"
    assert f"libcuda.so.{new_version}" in args
    assert foreign.read_text().startswith("cdiVersion: 0.5.0\nkind")
    assert cdi.refresh_after_activation(node_root, new_version) == []  # idempotent

    switch.rollback(node_root, load=False, callbacks=CALLBACKS)
    hosts = [m["hostPath"] for m in yaml.safe_load((node_root / "etc/cdi/nvidia.yaml").read_text())
             ["containerEdits"]["mounts"]]
    assert all(h.startswith(f"/opt/nvidia/{VERSION}/") for h in hosts)


def test_activation_refuses_when_the_spec_cannot_follow(node_root: Path, tmp_path: Path) -> None:
    """A spec nodeprep wrote sits in a directory that cannot be written (chattr +i): activation
    refuses before switching anything, so the spec never names another version than `current`."""
    import shutil
    import subprocess

    from nodeprep.errors import InputError
    from nodeprep.join.activation import CALLBACKS
    from nodeprep.node import switch

    from .conftest import install_driver

    if shutil.which("chattr") is None:
        pytest.skip("chattr (e2fsprogs) is needed to make a directory unwritable for root")
    _spec(node_root, "a10g_515.105.01.xml")
    install_driver(node_root, tmp_path / "work2", "535.216.03")
    (node_root / "opt/nvidia/current").unlink()
    (node_root / "opt/nvidia/current").symlink_to(VERSION)
    before = (node_root / "etc/cdi/nvidia.yaml").read_bytes()
    subprocess.run(["chattr", "+i", str(node_root / "etc/cdi")], check=True)
    try:
        with pytest.raises(InputError, match=r"cannot write /etc/cdi/nvidia.yaml: .* not activated"):
            switch.activate(node_root, "535.216.03", load=False, callbacks=CALLBACKS)
    finally:
        subprocess.run(["chattr", "-i", str(node_root / "etc/cdi")], check=True)
    assert (node_root / "opt/nvidia/current").readlink() == Path(VERSION)
    assert (node_root / "etc/cdi/nvidia.yaml").read_bytes() == before
