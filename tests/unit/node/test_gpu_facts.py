"""The CUDA gate's GPU facts file (/opt/nvidia/gpu-facts.json, nodeprep.node.gpufacts) as the real
CLI writes it beneath --root: every activation and `nodeprep labels` on a root with an active driver
record the node's GPUs (here PCI sysfs trees under ROOT/sys with real device ids: Tesla T4 10de:1eb8,
GeForce RTX 3090 10de:2204, A100 SXM4 10de:20b2), and the real gate process reads them; uninstall
removes the file nodeprep wrote and leaves (and names) one it did not. Real GPU starts through
podman: tests/slow/join/test_cuda_gate_podman.py."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from nodeprep.containerhooks import gate
from nodeprep.labels.gpu import GpuFacts, brand_from_name, brand_from_smi, parse_nvidia_smi_xml
from nodeprep.node import gpufacts
from tests.support.clirunner import invoke
from tests.support.fixtures import NVIDIA_SMI
from tests.support.standin import KERNEL, standin_store
from tests.unit.containerhooks.test_gate import refusal, run_gate
from tests.unit.node.test_node_support import DATA, sysfs
from tests.unit.node.test_node_uninstall import VERSION, debian_root

FACTS = gate.FACTS.lstrip("/")
T4, RTX3090, A100 = "1eb8", "2204", "20b2"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("gpufacts")
    return standin_store(work, work / "store", VERSION)


def installed(store: Path, root: Path, *gpus: str) -> Path:
    debian_root(root)
    sysfs(root, *gpus)
    r = invoke("install", "--store", str(store), "--driver", VERSION, "--kernel", KERNEL, "--activate",
               "--root", str(root))
    assert r.exit_code == 0, r.output
    return root


def recorded(root: Path) -> list[dict]:  # type: ignore[type-arg]
    return json.loads((root / FACTS).read_text())["gpus"]  # type: ignore[no-any-return]


def set_gpu(root: Path, device: str) -> None:
    shutil.rmtree(root / "sys")
    sysfs(root, device)


def test_activation_records_the_gpus_and_the_gate_uses_them(store: Path, tmp_path: Path) -> None:
    root = installed(store, tmp_path / "root", T4)
    assert [(g["brand"], g["arch"], g["name"]) for g in recorded(root)] == [("tesla", "7.5", "Tesla T4")]
    assert gate.read_facts(str(root / FACTS)) == [{"brand": "tesla", "arch": "7.5"}]
    need = ["NVIDIA_REQUIRE_CUDA=cuda>=12.9"]  # only the image's compat libcuda (CUDA 12.9) meets it
    assert run_gate(root, need, facts=None, compat="575.51.03").returncode == 0  # data center: compat used
    assert (root / "bundle/rootfs/etc/ld.so.conf.d" / gate.COMPAT_CONF).is_file()

    set_gpu(root, RTX3090)  # the same root on a GeForce: activating again records it
    r = invoke("activate", VERSION, "--root", str(root), "--json")
    assert r.exit_code == 0, r.output
    assert [(g["brand"], g["arch"]) for g in recorded(root)] == [("geforcertx", "8.6")]
    (root / "bundle/rootfs/etc/ld.so.conf.d" / gate.COMPAT_CONF).unlink()
    line = refusal(run_gate(root, need, facts=None, compat="575.51.03"))
    assert "forward-compatibility libcuda 575.51.03 is not used: GPU brand geforcertx" in line
    assert not (root / "bundle/rootfs/etc/ld.so.conf.d" / gate.COMPAT_CONF).exists()


def test_labels_record_the_facts_with_brands_from_the_drivers_list(store: Path, tmp_path: Path) -> None:
    root = installed(store, tmp_path / "root", RTX3090)
    (root / FACTS).unlink()
    r = invoke("labels", "--root", str(root), "--source", "pci", "--cloud", "none")
    assert r.exit_code == 0, r.output
    assert [g["brand"] for g in recorded(root)] == ["geforcertx"]
    # a GPU that pci.ids does not name: the brand comes from the active driver's supported-gpus.json
    (root / f"opt/nvidia/{VERSION}/share").mkdir(exist_ok=True)
    (root / f"opt/nvidia/{VERSION}/share/supported-gpus.json").write_bytes(
        gzip.decompress((DATA / "535.309.01.json.gz").read_bytes()))
    set_gpu(root, A100)
    empty = tmp_path / "pci.ids"
    empty.write_text("")
    r = invoke("labels", "--root", str(root), "--source", "pci", "--cloud", "none", "--pci-ids", str(empty))
    assert r.exit_code == 0, r.output
    (gpu,) = recorded(root)
    assert (gpu["brand"], gpu["name"], gpu["pci_device"]) == ("nvidia", "NVIDIA Device 20b2", "10de:20b2")


def test_labels_check_says_it_would_record_and_writes_nothing(store: Path, tmp_path: Path) -> None:
    root = installed(store, tmp_path / "root", T4)
    (root / FACTS).unlink()
    args = ("labels", "--root", str(root), "--source", "pci", "--cloud", "none")
    r = invoke(*args, "--check")
    assert r.exit_code == 0, r.output
    assert r.stdout == f"would write {root / FACTS} (GPU facts)\n" and not (root / FACTS).exists()
    assert invoke(*args).exit_code == 0 and [g["brand"] for g in recorded(root)] == ["tesla"]
    assert invoke(*args, "--check").stdout == f"{root / FACTS}: unchanged\n"


def test_hostile_facts_paths(store: Path, tmp_path: Path) -> None:
    """A link at the facts path is replaced, never written through; a folder there costs the
    activation nothing but a note (the facts are advisory: without them compat stays off)."""
    outside = tmp_path / "outside.json"
    outside.write_text("host file\n")
    root = debian_root(tmp_path / "root")
    sysfs(root, T4)
    (root / "opt/nvidia").mkdir(parents=True)
    (root / FACTS).symlink_to(outside)
    r = invoke("install", "--store", str(store), "--driver", VERSION, "--kernel", KERNEL, "--activate",
               "--root", str(root))
    assert r.exit_code == 0, r.output
    assert outside.read_text() == "host file\n" and not (root / FACTS).is_symlink()
    assert [g["brand"] for g in recorded(root)] == ["tesla"]
    (root / FACTS).unlink()
    (root / FACTS).mkdir()
    r = invoke("activate", VERSION, "--root", str(root), "--json")
    assert r.exit_code == 0, r.output
    assert any(n.startswith(f"{gate.FACTS}: GPU facts not written") for n in json.loads(r.stdout)["notes"])


def test_the_recording_says_what_was_there(store: Path, tmp_path: Path) -> None:
    """record() answers with the text it replaces (nodeprep_labels' diff): the stale file's, nothing
    through a link planted at the facts path, the content itself once recorded."""
    from nodeprep.node.layout import Layout

    outside = tmp_path / "outside.json"
    outside.write_text("host file\n")
    root = installed(store, tmp_path / "root", T4)
    gpu = gpufacts.gather(Layout(root), [])
    stale = '{"nodeprep": "gpu-facts", "source": "pci", "gpus": []}\n'
    (root / FACTS).write_text(stale)
    planned = gpufacts.record(root, gpu, check=True)
    assert planned is not None and planned.changed and planned.before == stale
    assert (root / FACTS).read_text() == stale  # check: nothing written
    (root / FACTS).unlink()
    (root / FACTS).symlink_to(outside)
    planned = gpufacts.record(root, gpu)
    assert planned is not None and planned.changed and planned.before == ""  # never read through the link
    assert outside.read_text() == "host file\n" and (root / FACTS).read_text() == planned.content
    again = gpufacts.record(root, gpu)
    assert again is not None and not again.changed and again.before == again.content


def test_labels_on_a_root_without_an_active_driver_write_nothing(tmp_path: Path) -> None:
    root = sysfs(tmp_path / "root", T4)
    r = invoke("labels", "--root", str(root), "--source", "pci", "--cloud", "none")
    assert r.exit_code == 0, r.output
    assert not (root / "opt").exists()


def test_an_image_root_without_sys_records_nothing(store: Path, tmp_path: Path) -> None:
    root = debian_root(tmp_path / "root")
    r = invoke("install", "--store", str(store), "--driver", VERSION, "--kernel", KERNEL, "--activate",
               "--root", str(root))
    assert r.exit_code == 0, r.output
    assert not (root / FACTS).exists()  # this machine's GPUs are not the image's


def test_uninstall_removes_ours_and_names_a_foreign_one(store: Path, tmp_path: Path) -> None:
    root = installed(store, tmp_path / "root", T4)
    plan = json.loads(invoke("uninstall", "--check", "--json", "--root", str(root)).stdout)
    assert "/" + FACTS in plan["remove"]
    r = invoke("uninstall", "--root", str(root))
    assert r.exit_code == 0, r.output
    assert not (root / FACTS).exists() and not (root / "opt/nvidia").exists()

    root = installed(store, tmp_path / "other", T4)
    (root / FACTS).write_text(json.dumps({"gpus": [{"brand": "tesla", "arch": "7.5"}]}))  # hand-written
    r = invoke("uninstall", "--root", str(root), "--json")
    assert r.exit_code == 0, r.output
    assert f"/{FACTS}: not written by nodeprep; left in place" in json.loads(r.stdout)["kept"]
    assert (root / FACTS).is_file()


def test_brands_from_each_source() -> None:
    # nvidia-smi's <product_brand> (real captures), NVML's name without spaces
    brands = {p.name: [g.brand for g in parse_nvidia_smi_xml(p.read_bytes()).gpus]
              for p in sorted(NVIDIA_SMI.glob("*.xml"))}
    assert brands["tesla-t4_515.105.01.xml"] == ["nvidia"]
    assert brands["dual-rtx-a5000_590.44.01.xml"] == ["nvidiartx", "nvidiartx"]
    assert brand_from_smi("NVIDIA Virtual Compute Server") == "nvidiavcs"
    # product names (PCI ids, supported-gpus.json): only what the name says
    assert [brand_from_name(n) for n in ("Tesla T4", "NVIDIA H100 80GB HBM3", "NVIDIA A10G",
                                         "NVIDIA GeForce RTX 3090", "GeForce GTX 680", "Quadro RTX 8000",
                                         "NVIDIA RTX A6000", "NVIDIA T1000", "NVIDIA Device 20b2")] == [
        "tesla", "nvidia", "nvidia", "geforcertx", "geforce", "quadrortx", "nvidiartx", None, None]


def test_the_file_is_recognised_by_its_first_bytes() -> None:
    text = gpufacts.render(GpuFacts("pci"), {})
    assert gpufacts.is_ours(text.encode()) and json.loads(text) == {"nodeprep": "gpu-facts", "source": "pci",
                                                                    "gpus": []}
    assert not gpufacts.is_ours(b'{"gpus": []}')
