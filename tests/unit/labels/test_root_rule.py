"""One `--root` rule for a node's labels (nodeprep.labels.options.label_options), whichever front-end
asks: `nodeprep labels`, `nodeprep join`, `nodeprep bootstrap` and the collection's nodeprep_labels,
given the same profile and root, label the node alike. The root is an image whose /sys is an
absolute link (to /var/lib/image-sys): the booted node resolves it inside the image, and so must
every front-end (they used to differ: the collection resolved it beneath the root, the others
followed it to this host)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeprep.cli import main
from nodeprep.labels.options import label_options
from nodeprep.labels.profilelabels import ProfileLabels
from tests.support.clirunner import separate_stderr
from tests.support.standin import KERNEL
from tests.unit.bootstrap.test_bootstrap_cli import image_root

EXTRA = {"example.com/pool": "gpu-a", "node.kubernetes.io/pool": "gpu-a"}


def linked_sysfs_root(tmp_path: Path) -> tuple[Path, Path]:
    """An image root (one kernel, a token, a store of small real artifacts) whose /sys links to
    /var/lib/image-sys, where one NVIDIA 3D controller is; the profile labels it with EXTRA."""
    root, profile = image_root(tmp_path)
    dev = root / "var/lib/image-sys/bus/pci/devices/0000:3b:00.0"
    dev.mkdir(parents=True)
    for name, value in (("vendor", "0x10de"), ("device", "0x1eb8"), ("class", "0x030200")):
        (dev / name).write_text(value + "\n")
    (root / "sys").symlink_to("/var/lib/image-sys")
    data = yaml.safe_load(profile.read_text())
    data["labels"] = {"cloud": "none", "extra": EXTRA}
    profile.write_text(yaml.safe_dump(data))
    return root, profile


def cli(*args: str) -> dict[str, Any]:
    r = separate_stderr().invoke(main, list(args))
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def test_label_options_read_the_roots_own_sysfs(tmp_path: Path) -> None:
    root, _ = linked_sysfs_root(tmp_path)
    opts = label_options(root, ProfileLabels(extra=EXTRA, cloud="none"))
    assert opts.sysfs_root == root / "var/lib/image-sys"  # the image's link, resolved inside the image
    assert (opts.use_nvml, opts.run_nvidia_smi) == (False, False)  # this host's driver is not the image's
    assert (opts.extra, opts.cloud, opts.kernel) == (EXTRA, "none", None)
    given = label_options(root, sysfs_root=tmp_path / "elsewhere", kernel=KERNEL, use_nvml=True)
    assert (given.sysfs_root, given.kernel, given.use_nvml, given.cloud) == (tmp_path / "elsewhere", KERNEL,
                                                                            True, "auto")
    live = label_options(Path("/"))
    assert (live.sysfs_root, live.use_nvml, live.run_nvidia_smi) == (Path("/sys"), True, True)


def test_every_front_end_labels_a_root_alike(tmp_path: Path) -> None:
    pytest.importorskip("ansible")
    from tests.unit.fleet.test_module_sequence import module

    root, profile = linked_sysfs_root(tmp_path)
    labels_cmd = cli("labels", "--root", str(root), "--profile", str(profile))["labels"]
    planned = cli("join", "--root", str(root), "--profile", str(profile), "--check", "--json",
                  "--skip-preflight", "--skip-discovery")
    join = {**planned["labels"], **planned["api_labels"]}
    steps = cli("bootstrap", "--root", str(root), "--profile", str(profile), "--check", "--json")["steps"]
    bootstrap = next(s for s in steps if s["name"] == "labels")["result"]["labels"]
    args = {"root": str(root), "cloud": "none", "extra": EXTRA, "kernel": KERNEL, "nfd_file": "",
            "json_file": ""}
    status, result = module("nodeprep_labels", args, check=True)
    assert status == "SUCCESS", result
    collection = result["labels"]
    assert labels_cmd["nvidia.com/gpu.count"] == "1" and labels_cmd["nvidia.com/gpu.mode"] == "compute"
    assert labels_cmd["nodeprep.dev/kernel"] == KERNEL.replace("+", "_")
    assert {k: labels_cmd[k] for k in EXTRA} == EXTRA
    assert join == labels_cmd, "join"
    assert bootstrap == labels_cmd, "bootstrap"
    assert collection == labels_cmd, "collection"
