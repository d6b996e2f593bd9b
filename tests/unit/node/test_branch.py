"""The driver follows the GPUs (issue 27, item 4): version and flavour chosen from each candidate's real
supported-gpus.json (tests/unit/data/supported-gpus/: 535.309.01, 550.163.01 and Debian experimental's
555.58.02, see SOURCES.md) for real device ids: H200 10de:2335, B200 10de:2901, RTX PRO 6000
10de:2bb4, V100 10de:1db6 (no open modules), GTX 680 10de:1180 (470 legacy)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from nodeprep.errors import InputError
from nodeprep.node import support
from nodeprep.node.branch import Candidate, choose

DATA = Path(__file__).resolve().parents[1] / "data" / "supported-gpus"
VERSIONS = ("535.309.01", "550.163.01", "555.58.02")
BOTH = ("proprietary", "open")


def candidates(*versions: str, flavours: tuple[str, ...] = BOTH) -> list[Candidate]:
    return [Candidate(v, flavours, gzip.decompress((DATA / f"{v}.json.gz").read_bytes()).decode())
            for v in versions or VERSIONS]


def test_h200_takes_the_oldest_or_newest_branch_that_lists_it():
    """535.309.01's list does not name the H200 (its newest device is 10de:28f8, so install would only
    note it); 550.163.01 is the oldest that names it, Debian experimental's 555.58.02 the newest."""
    oldest = choose(candidates(), ["10de:2335"], policy="oldest")
    assert (oldest.version, oldest.flavour, oldest.tried) == ("550.163.01", "proprietary",
                                                              ("535.309.01", "550.163.01"))
    newest = choose(candidates(), ["10de:2335"])
    assert (newest.version, newest.flavour) == ("555.58.02", "proprietary")
    assert newest.tried == ("555.58.02",)  # the versions looked at
    assert choose(candidates(), ["10de:2335"], preferred="open").flavour == "open"


def test_a_gpu_without_open_modules_takes_the_proprietary_flavour():
    got = choose(candidates(), ["10de:2335", "10de:1db6:10de:124a"], preferred="open")
    assert (got.version, got.flavour) == ("555.58.02", "proprietary")
    with pytest.raises(InputError, match="not supported by the open kernel modules of 555.58.02"):
        choose(candidates(flavours=("open",)), ["10de:1db6"])


def test_blackwell_needs_the_open_flavour_and_no_candidate_lists_it():
    assert support.needs_open("10de:2901") and support.needs_open("10de:2bb4:10de:204b")
    assert support.needs_open("10de:2342") and not support.needs_open("10de:2335")
    with pytest.raises(InputError) as e:
        choose(candidates(), ["10de:2335", "10de:2901"])
    assert str(e.value).startswith(
        "--gpus: no driver version supports every GPU of the node (10de:2335, 10de:2901); tried "
        "555.58.02, 550.163.01, 535.309.01 (newest first): ")
    assert "(PCI 10de:2901) is newer than 555.58.02" in str(e.value)
    assert "10de:2901" in (e.value.hint or "") and "535.309.01" in (e.value.hint or "")
    with pytest.raises(InputError, match="535.309.01 has no open flavour here"):
        choose(candidates("535.309.01", flavours=("proprietary",)), ["10de:2bb4"])


def test_a_gpu_moved_to_a_legacy_branch_is_refused_naming_it():
    with pytest.raises(InputError, match=r"GeForce GTX 680 \(PCI 10de:1180\) is not supported by 535.309.01: "
                                         r"NVIDIA moved it to the 470.xx legacy branch"):
        choose(candidates(), ["10de:1180"], policy="oldest")


def test_bad_input_is_refused_before_choosing():
    with pytest.raises(InputError, match=r"'8086:1234': not an NVIDIA PCI id"):
        choose(candidates(), ["8086:1234"])
    with pytest.raises(InputError, match="policy 'middle' is not one of newest, oldest"):
        choose(candidates(), ["10de:2335"], policy="middle")
    with pytest.raises(InputError, match="no driver version to choose from"):
        choose([], ["10de:2335"])
    with pytest.raises(InputError, match="^supported-gpus.json of 9.9: not NVIDIA's supported-gpus list"):
        choose([Candidate("9.9", BOTH, "{}")], ["10de:2335"])


# -- install --gpus: the real CLI over a store of user-space artifacts carrying the real lists ------

KERNEL = "6.1.0-50-amd64"


def _publish(store: Path, tmp: Path, kind: str, version: str, flavour: str | None = None) -> None:
    from nodeprep import artifact

    payload = tmp / f"payload-{kind}-{version}-{flavour}"
    if kind == "userspace":
        (payload / "share").mkdir(parents=True)
        (payload / "share" / "supported-gpus.json").write_bytes(
            gzip.decompress((DATA / f"{version}.json.gz").read_bytes()))
        extra: dict = {}
    else:
        (payload / "modules" / KERNEL).mkdir(parents=True)
        (payload / "modules" / KERNEL / "nvidia.ko").write_bytes(b"\0" * 64)
        extra = dict(flavour=flavour, kernel_release=KERNEL, vermagic=f"{KERNEL} SMP")
    manifest = artifact.Manifest(kind=kind, driver_version=version, arch="amd64", os="debian-12",
                                 input_digest="1" * 64, inputs={}, **extra)
    path, manifest = artifact.pack(payload, manifest, tmp / "out")
    artifact.LocalStore(store).publish(path, manifest)


@pytest.fixture(scope="module")
def gpu_store(tmp_path_factory) -> Path:
    """535.309.01 (proprietary), 550.163.01 and 555.58.02 (both flavours) for 6.1.0-50-amd64."""
    tmp = tmp_path_factory.mktemp("gpu-store")
    store = tmp / "store"
    store.mkdir()
    for version, flavours in (("535.309.01", ("proprietary",)), ("550.163.01", BOTH), ("555.58.02", BOTH)):
        _publish(store, tmp, "userspace", version)
        for flavour in flavours:
            _publish(store, tmp, "kmod", version, flavour)
    return store


def _install_check(root: Path, store: Path | str, *args: str):  # type: ignore[no-untyped-def]
    from tests.support.clirunner import invoke

    return invoke("install", "--store", str(store), "--kernel", KERNEL, "--root", str(root), "--check",
                  "--json", *args)


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_install_follows_the_node_gpus(gpu_store: Path, tmp_path: Path) -> None:
    import json

    from tests.unit.node.test_node_support import sysfs

    root = sysfs(tmp_path / "root", "2335:10de:16c3", "2335:10de:16c3")
    before = _tree(root)
    res = _install_check(root, gpu_store, "--gpus", "node")
    assert res.exit_code == 0, res.output
    plan = json.loads(res.output[res.output.index("{"):])
    assert plan["version"] == "555.58.02" and "-proprietary-" in plan["install_kmod"], plan
    res = _install_check(root, gpu_store, "--gpus", "10de:2335", "--branch-policy", "oldest",
                         "--flavour", "open")
    assert res.exit_code == 0, res.output
    plan = json.loads(res.output[res.output.index("{"):])
    assert plan["version"] == "550.163.01" and "-open-" in plan["install_kmod"], plan
    assert _tree(root) == before  # a plan: nothing written


def test_install_refuses_gpus_no_store_version_supports(gpu_store: Path, tmp_path: Path) -> None:
    from tests.support.clirunner import error_line
    from tests.support.httpdir import serve_directory

    root = tmp_path / "root"
    root.mkdir()
    with serve_directory(gpu_store) as url:  # a remote store: its lists are read, and nothing is left
        res = _install_check(root, url, "--gpus", "10de:2335,10de:2901")
    assert res.exit_code == 2
    line = error_line(res)
    assert line.startswith("error: --gpus: no driver version supports every GPU of the node "
                           "(10de:2335, 10de:2901); tried 555.58.02, 550.163.01, 535.309.01 (newest first): ")
    assert "(PCI 10de:2901) is newer than 555.58.02" in line
    assert _tree(root) == []
    res = _install_check(root, gpu_store, "--gpus", "node")
    assert error_line(res) == f"error: --gpus: no NVIDIA GPU under {root / 'sys/bus/pci/devices'}"
    res = _install_check(root, gpu_store, "--gpus", "10de:2335", "--driver", "555.58.02")
    assert error_line(res) == "error: --gpus chooses the driver version: not with --driver"
    res = _install_check(root, gpu_store, "--gpus", "1234")
    assert error_line(res).startswith("error: --gpus: '1234' is not 'node' or a comma list of NVIDIA PCI ids")
    assert _tree(root) == []


def _profile(tmp_path: Path, store: Path | str, version: str, flavour: str) -> Path:
    path = tmp_path / "node.yaml"
    path.write_text(f'driver:\n  version: "{version}"\n  flavour: {flavour}\n  store: "{store}"\n')
    return path


def test_profile_check_refuses_a_pinned_version_that_does_not_run_the_gpus(gpu_store: Path, tmp_path: Path):
    """`profile check --gpus`: where the GPUs are known, a pinned driver.version (and flavour) whose
    list in the store does not run one of them is refused naming the field and the GPU."""
    from tests.support.clirunner import error_line, invoke
    from tests.unit.node.test_node_support import sysfs

    root = sysfs(tmp_path / "root", "2335", "1db6")
    good = _profile(tmp_path, gpu_store, "555.58.02", "proprietary")
    res = invoke("profile", "check", "--profile", str(good), "--root", str(root), "--gpus", "node")
    assert res.exit_code == 0, res.output
    res = invoke("profile", "check", "--profile", str(good), "--root", str(root), "--gpus", "10de:2901")
    assert res.exit_code == 2
    assert error_line(res).startswith(
        "error: driver.version: NVIDIA device 10de:2901 (PCI 10de:2901) is newer than 555.58.02")
    opened = _profile(tmp_path, gpu_store, "555.58.02", "open")  # the V100 has no open modules
    res = invoke("profile", "check", "--profile", str(opened), "--root", str(root), "--gpus", "node")
    assert "Tesla V100-PCIE-32GB (PCI 10de:1db6) is not supported by the open kernel modules of 555.58.02" \
        in error_line(res)
    # 535.309.01's list does not name the H200: install only notes that, and so does the check
    old = _profile(tmp_path, gpu_store, "535.309.01", "proprietary")
    res = invoke("profile", "check", "--profile", str(old), "--root", str(root), "--gpus", "10de:2335")
    assert res.exit_code == 0, res.output
    missing = _profile(tmp_path, gpu_store, "560.35.03", "proprietary")
    res = invoke("profile", "check", "--profile", str(missing), "--root", str(root), "--gpus", "node")
    assert error_line(res) == ("error: driver.version: 560.35.03 has no user-space artifact (amd64) in "
                               "the store")
    res = invoke("profile", "check", "--profile", str(old), "--root", str(root))  # GPUs not known
    assert res.exit_code == 0, res.output


def test_install_gpus_keeps_a_profiles_pinned_version_and_checks_it(gpu_store: Path, tmp_path: Path):
    """With --gpus, a profile that pins driver.version keeps its pin (not the newest 555.58.02), and a
    pin whose list rules out a GPU of the node is refused naming the field."""
    import json

    from tests.support.clirunner import error_line
    from tests.unit.node.test_node_support import sysfs

    root = sysfs(tmp_path / "root", "2335", "1db6")
    pinned = _profile(tmp_path, gpu_store, "550.163.01", "proprietary")
    res = _install_check(root, gpu_store, "--gpus", "node", "--profile", str(pinned))
    assert res.exit_code == 0, res.output
    plan = json.loads(res.output[res.output.index("{"):])
    assert plan["version"] == "550.163.01" and "-proprietary-" in plan["install_kmod"], plan
    opened = _profile(tmp_path, gpu_store, "555.58.02", "open")
    res = _install_check(root, gpu_store, "--gpus", "node", "--profile", str(opened))
    assert res.exit_code == 2
    assert error_line(res).startswith("error: driver.version: Tesla V100-PCIE-32GB (PCI 10de:1db6) is not "
                                      "supported by the open kernel modules of 555.58.02")


# -- a pinned branch (driver.branch, `--branch`): the profile's field and the flag of the one vocabulary --


def _branch_profile(tmp_path: Path, store: Path | str, **driver: str) -> Path:
    import yaml

    path = tmp_path / "branch.yaml"
    path.write_text(yaml.safe_dump({"driver": {"store": str(store), **driver}}))
    return path


def test_install_takes_a_version_of_the_pinned_branch(gpu_store: Path, tmp_path: Path) -> None:
    """driver.branch without a version: the policy's version of that branch in the store (the flag
    `--branch` the same); with the GPUs, the newest of the branch that runs them; `--branch` and a
    version of another branch contradict each other."""
    import json

    from tests.support.clirunner import error_line

    root = tmp_path / "root"
    root.mkdir()
    prof = _branch_profile(tmp_path, gpu_store, branch="550", flavour="open")
    res = _install_check(root, gpu_store, "--profile", str(prof))
    assert res.exit_code == 0, res.output
    assert json.loads(res.output[res.output.index("{"):])["version"] == "550.163.01"
    res = _install_check(root, gpu_store, "--branch", "555", "--gpus", "10de:2335", "--flavour", "open")
    assert res.exit_code == 0, res.output
    plan = json.loads(res.output[res.output.index("{"):])
    assert plan["version"] == "555.58.02" and "-open-" in plan["install_kmod"], plan
    prof = _branch_profile(tmp_path, gpu_store, branch="535", gpus="10de:1db6", branch_policy="oldest")
    res = _install_check(root, gpu_store, "--profile", str(prof))
    assert res.exit_code == 0, res.output
    assert json.loads(res.output[res.output.index("{"):])["version"] == "535.309.01"
    res = _install_check(root, gpu_store, "--driver", "550.163.01", "--branch", "555")
    assert error_line(res) == "error: --branch: 555 contradicts driver.version 550.163.01 (of branch 550)"
    res = _install_check(root, gpu_store, "--branch", "55")
    assert error_line(res) == "error: --branch: '55' is not a driver branch (its major number, e.g. 580)"
    assert _tree(root) == []


def test_install_refuses_a_branch_without_a_version_for_the_gpus(gpu_store: Path, tmp_path: Path) -> None:
    """The H200 (10de:2335) is not in 535.309.01's list: branch 535 is refused naming the GPU and the
    branch; a branch the store has no version of is refused naming the branch and the store."""
    from tests.support.clirunner import error_line
    from tests.unit.node.test_node_support import sysfs

    root = sysfs(tmp_path / "root", "2335:10de:16c3")
    before = _tree(root)
    prof = _branch_profile(tmp_path, gpu_store, branch="535", gpus="node")
    res = _install_check(root, gpu_store, "--profile", str(prof))
    assert res.exit_code == 2
    assert error_line(res).startswith(
        "error: --branch: no driver version of branch 535 supports every GPU of the node "
        "(10de:2335:10de:16c3); tried 535.309.01 (newest first): ")
    res = _install_check(root, gpu_store, "--branch", "580")
    assert error_line(res) == (f"error: --branch: 580 has no version in the store {gpu_store} (a user space "
                               f"for amd64 and kernel modules for {KERNEL})")
    assert _tree(root) == before


def test_profile_check_refuses_a_pinned_branch_that_does_not_run_the_gpus(gpu_store: Path, tmp_path: Path):
    """`profile check --gpus` (or a profile whose driver.gpus lists the GPUs): a driver.branch none of
    whose versions in the store runs a GPU is refused naming the GPU and the branch, exit 2."""
    from tests.support.clirunner import error_line, invoke

    root = tmp_path / "root"
    root.mkdir()
    old = _branch_profile(tmp_path, gpu_store, branch="535")
    res = invoke("profile", "check", "--profile", str(old), "--root", str(root), "--gpus", "10de:2335")
    assert res.exit_code == 2
    assert error_line(res).startswith(
        "error: driver.branch: no driver version of branch 535 supports every GPU of the node (10de:2335); "
        "tried 535.309.01 (newest first): ")
    res = invoke("profile", "check", "--profile", str(old), "--root", str(root), "--gpus", "10de:1db6")
    assert res.exit_code == 0, res.output
    assert "driver.branch: 535.309.01 (proprietary) runs 10de:1db6" in res.output
    listed = _branch_profile(tmp_path, gpu_store, branch="535", gpus="10de:2335")
    res = invoke("profile", "check", "--profile", str(listed), "--root", str(root))
    assert res.exit_code == 2 and "no driver version of branch 535 supports" in error_line(res)
    res = invoke("profile", "check", "--profile", str(_branch_profile(tmp_path, gpu_store, branch="550")),
                 "--root", str(root), "--gpus", "10de:2335")
    assert res.exit_code == 0, res.output
    res = invoke("profile", "check", "--profile", str(_branch_profile(tmp_path, gpu_store, branch="580")),
                 "--root", str(root), "--gpus", "10de:2335")
    assert error_line(res) == f"error: driver.branch: 580 has no version in the store {gpu_store}"
    assert list(root.iterdir()) == []
