"""Real builds of the Debian 12 cells of issues 13 and 27 (tests/support/realbuild.py CELLS, one compile
per test cache, input-digest hits afterwards): the open 535.261.03 modules for a bookworm 6.1 kernel,
the proprietary backports driver (535.216.03~bpo12) for a bookworm-backports 6.12 kernel and Debian
experimental's 555.58.02 for a bookworm 6.1 kernel, all in the bookworm build root with gcc-12,
checked against the compiler that built *that* kernel. Why each cell pins its kernel is written in
CELLS."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from nodeprep import artifact, runner
from tests.support.realbuild import CELLS, ensure_cell

pytestmark = pytest.mark.slow


def modinfo(ko: Path, field: str) -> str:
    return runner.run(["modinfo", "-F", field, ko]).stdout.strip()


@pytest.mark.parametrize("cell,license_,package,tag", [
    ("debian12-open", "Dual MIT/GPL", "nvidia-open-kernel-source", ""),
    ("debian12-backports", "NVIDIA", "nvidia-kernel-source", "~bpo12"),
    # Debian experimental's 555 (issue 27): its sources, bookworm's kernel, build root and gcc-12
    ("debian12-experimental", "NVIDIA", "nvidia-kernel-source", "555.58.02-"),
])
def test_cell_built_with_the_kernels_own_compiler(cell: str, license_: str, package: str, tag: str,
                                                  test_cache: Path, tmp_path: Path) -> None:
    built = ensure_cell(test_cache, cell)
    spec = CELLS[cell]
    m = artifact.extract(built.kmod, tmp_path)
    assert (m.os, m.flavour, m.driver_version, m.kernel_release) == (
        "debian-12", spec["flavour"], spec["driver"], spec["kernel"])
    # the compiler check compared the build root's gcc-12 with the one that built this kernel
    assert "gcc-12 (Debian 12.2.0-14" in m.compiler
    assert m.extra["build"]["build_compiler"].split()[-1] == m.compiler.split()[-1]
    assert "cc_mismatch" not in m.extra["build"]
    assert m.extra["source"]["package"] == package and tag in m.extra["source"]["version"]
    assert m.extra["source"].get("suite") == spec.get("driver_suite")
    # (the 6.12.NN+deb12 kernels' own packages are 6.12.NN-1~deb12uN: bookworm's updates serve them now)
    assert f"linux-headers-{m.kernel_release}_" in " ".join(m.inputs), m.inputs
    ko = tmp_path / "modules" / str(m.kernel_release) / "nvidia.ko"
    assert modinfo(ko, "vermagic").startswith(f"{m.kernel_release} SMP ")
    assert modinfo(ko, "version") == spec["driver"]
    assert modinfo(ko, "license") == license_


def test_backports_kernel_resolves_to_the_backports_driver_from_the_cli(test_cache: Path) -> None:
    """`build-driver --os debian-12 --kernel <backports kernel>` with no --driver picks the backports
    driver sources and headers (a store hit after the cell's build: nothing compiles), and asking for
    the mainline driver on that kernel names the choice."""
    spec = CELLS["debian12-backports"]
    store = test_cache / "real-build-debian12-backports" / "store"
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    ensure_cell(test_cache, "debian12-backports")
    base = [sys.executable, "-m", "nodeprep.cli", "build-driver", "--os", "debian-12",
            "--kernel", spec["kernel"], "--store", store, "--cache", test_cache, "--no-userspace",
            "--no-smoke-test", "--json"]
    hit = runner.run(base, check=False, timeout=600, env=env)
    assert hit.returncode == 0, hit.stderr
    data = json.loads(hit.stdout)
    assert data["cached"] is True and data["compiled"] is False
    assert data["driver_version"] == spec["driver"] and data["kernel_release"] == spec["kernel"]
    wrong = runner.run([*base, "--driver", "535.309.01"], check=False, timeout=600, env=env)
    assert wrong.returncode == 2
    assert wrong.stderr.startswith("error: --driver: driver 535.309.01 (proprietary) is not built for "
                                   f"debian-12 backports kernel {spec['kernel']}"), wrong.stderr
    assert "535.216.03" in wrong.stderr and "Traceback" not in wrong.stderr
