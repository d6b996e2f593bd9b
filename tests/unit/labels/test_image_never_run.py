"""Nothing of an image under `--root` is run (issue #35, finding 4): the image's
opt/nvidia/current/bin/nvidia-smi is a script that leaves a canary on the host, and its own sys/
claims a loaded driver with an NVIDIA GPU; this host has no nvidia-smi on PATH. `labels --root IMG
--source nvidia-smi` is refused with one `error:` line (exit 2, docs/labels.md), `labels --root
IMG` labels from the image's PCI ids, and `verify-gpus --root IMG --sysfs-root IMG/sys` reads the
facts it can without running anything: the canary never appears."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from nodeprep.cli import main

from .conftest import add_pci, stand_in

pytestmark = pytest.mark.usefixtures("no_host_nvidia_smi")


def _image(tmp_path: Path, canary: Path) -> Path:
    image = tmp_path / "image"
    stand_in(image, f"echo ran >> {canary}")
    (image / "etc").mkdir()
    (image / "etc/os-release").write_text('ID=debian\nVERSION_ID="12"\n')
    (image / "sys/module/nvidia").mkdir(parents=True)
    (image / "sys/module/nvidia/version").write_text("535.54.03\n")
    (image / "sys/bus/pci/devices").mkdir(parents=True)
    add_pci(image / "sys", "0000:00:1e.0", 0x10DE, 0x1EB8, 0x030200)
    return image


def test_labels_source_nvidia_smi_under_an_image_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    image = _image(tmp_path, canary)
    args = ["labels", "--root", str(image), "--source", "nvidia-smi", "--cloud", "none"]
    r = CliRunner().invoke(main, args)
    assert not canary.exists()
    assert r.exit_code == 2, r.output
    lines = r.stderr.splitlines()
    assert lines[0] == (f"error: --source nvidia-smi with --root {image}: this host has no nvidia-smi on "
                        "PATH, and the one under --root is never run (it is the image's program, not this "
                        "host's)")
    assert "Traceback" not in r.output and r.stdout == ""


def test_labels_and_verify_gpus_under_an_image_run_nothing(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    image = _image(tmp_path, canary)
    r = CliRunner().invoke(main, ["labels", "--root", str(image), "--cloud", "none", "--json"])
    assert r.exit_code == 0, r.output
    assert not canary.exists()
    assert '"gpu": "pci"' in r.stdout
    r = CliRunner().invoke(main, ["verify-gpus", "--root", str(image), "--sysfs-root", str(image / "sys")])
    assert not canary.exists()
    assert "Traceback" not in r.output
