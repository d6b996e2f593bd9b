"""The new real cells (tests/support/realbuild.py CELLS) smoke-tested in qemu on their own kernels,
and docs/build.md's support table checked against what the cells produce.

Each cell is compiled once per test cache; the boot is real (the kernel the cell was built for,
from its own archive: trixie, bookworm, bookworm-backports). No GPU exists here, so a good nvidia.ko
(proprietary or open) stops at its PCI probe with ENODEV after "NVRM: No NVIDIA GPU found."."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from nodeprep import artifact, runner
from tests.support import supporttable
from tests.support.realbuild import (
    CELLS,
    OPEN_SOURCE_CELLS,
    SHARED,
    ensure_cell,
    ensure_open_source_cell,
    ensure_real_build,
    open_release,
)

pytestmark = pytest.mark.slow


def smoke(kmod: Path, cache: Path) -> dict:  # type: ignore[type-arg]
    """`nodeprep smoke-test ARTIFACT --json` as the operator runs it (the OS is the artifact's)."""
    res = runner.run([sys.executable, "-m", "nodeprep.cli", "smoke-test", kmod, "--cache", cache, "--json"],
                     check=False, timeout=900, env={"PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    assert res.returncode in (0, 1), res.stderr
    return json.loads(res.stdout)


def built(cache: Path, cell: str):  # type: ignore[no-untyped-def]
    if cell in OPEN_SOURCE_CELLS:
        return ensure_open_source_cell(cache, cell)
    return ensure_real_build(cache) if cell == SHARED else ensure_cell(cache, cell)


def smoke_and_record(cache: Path, cell: str) -> dict:  # type: ignore[type-arg]
    build = built(cache, cell)
    data = smoke(build.kmod, cache)
    supporttable.record_smoke(cache, cell, kmod=build.kmod, input_digest=build.input_digest,
                              verdict=data["verdict"])
    return data | {"built": build}


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_cell_passes_the_smoke_test_on_its_own_kernel(cell: str, test_cache: Path) -> None:
    data = smoke_and_record(test_cache, cell)
    built = data["built"]
    assert data["verdict"] == "PASS", data
    assert data["kernel_release"] == built.kernel_release == CELLS[cell]["kernel"]
    lines = data["log_excerpt"].splitlines()
    # open and proprietary modules alike print this when the probe finds no GPU (docs/smoke-test.md)
    assert "NVRM: No NVIDIA GPU found." in lines
    assert "insmod nvidia: No such device" in lines
    assert data["modules"]["nvidia"] == "probe: no GPU (ENODEV)"
    for name in ("nvidia_uvm", "nvidia_modeset", "nvidia_drm"):
        assert data["modules"][name].startswith("symbols resolved ("), data["modules"]


def test_support_table_matches_the_doc(test_cache: Path) -> None:
    """docs/build.md's table (between its markers) is what the cells produce: every column but the
    build time (it varies with the machine; see tests/support/supporttable.py). Cells this session
    did not smoke-test are smoke-tested here, so the table never quotes an untested artifact."""
    for cell in supporttable.CELL_ORDER:
        release = OPEN_SOURCE_CELLS.get(cell, {}).get("release")
        if release and isinstance(why := open_release(release), str):
            pytest.skip(f"the table's row for {cell} needs its release: {why}")
        build = built(test_cache, cell)
        if supporttable.smoke_verdict(test_cache, cell, build.input_digest) is not None:
            continue
        if cell in OPEN_SOURCE_CELLS:  # booted by its build (smoke_test=True): that verdict
            verdict = artifact.read_manifest(build.kmod).extra["smoke_test"]["verdict"]
            supporttable.record_smoke(test_cache, cell, kmod=build.kmod, input_digest=build.input_digest,
                                      verdict=verdict)
        else:
            smoke_and_record(test_cache, cell)
    produced = [supporttable.row(test_cache, c) for c in supporttable.CELL_ORDER]
    assert all(r["smoke test"] == "PASS" for r in produced), produced
    documented = supporttable.parse(supporttable.doc_table(supporttable.DOC.read_text()))
    assert supporttable.checked(documented) == supporttable.checked(produced), (
        "docs/build.md's support table differs from the cells; regenerate it with "
        "`python -m tests.support.supporttable --write` (NODEPREP_TEST_CACHE as in this run)"
    )
