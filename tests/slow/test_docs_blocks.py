"""The slow tier's runner of documented commands: every console block of README.md and docs/*.md
marked `<!-- docs-test: slow: MATERIAL, ... -->` runs as written, in an empty directory holding the
material it names (tests/support/docs.py MATERIALS, made here from what the suite already has), with
this checkout's nodeprep first on PATH; each command's output (stdout and stderr) must be what the
doc shows, a line `...` standing for any lines and `…` for any text on a line."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.docs import DOCS, MATERIALS, Block, blocks, console_commands, expected_output, materials
from tests.support.fixtures import REPO
from tests.support.realbuild import RealBuild, ensure_cell, ensure_real_build
from tests.support.standin import standin_store

pytestmark = pytest.mark.slow

SLOW_BLOCKS = [b for doc in DOCS for b in blocks(doc) if b.is_command and b.kind == "slow"]


def _store(cwd: Path, cache: Path) -> dict[str, str]:
    del cache
    standin_store(cwd / ".work", cwd / "artifacts", "535.309.01")
    return {}


def _image_root(cwd: Path, cache: Path) -> dict[str, str]:
    del cache
    (cwd / "img").mkdir()
    return {"ROOT": str(cwd / "img")}


def _real_build(cwd: Path, cache: Path, build: RealBuild | None = None) -> dict[str, str]:
    build = build or ensure_real_build(cache)
    for artifact in (build.kmod, build.userspace):  # copies: a block cannot change the shared build
        if artifact is not None:
            shutil.copyfile(artifact, cwd / artifact.name)
    return {"NODEPREP_CACHE": str(build.cache or cache)}


def _open_build(cwd: Path, cache: Path) -> dict[str, str]:
    return _real_build(cwd, cache, ensure_cell(cache, "debian12-open", userspace=True))


MAKERS: dict[str, Callable[[Path, Path], dict[str, str]]] = {
    "store": _store, "image-root": _image_root, "real-build": _real_build, "open-build": _open_build}


def test_every_material_has_a_maker() -> None:
    assert set(MAKERS) == set(MATERIALS)


def test_the_output_pattern_reads_elisions() -> None:
    shown = "a (x, …)\n...\nz\n"
    assert expected_output(shown).fullmatch("a (x, y-1)\nb\nc\nz\n")
    assert expected_output(shown).fullmatch("a (x, )\nz\n")
    assert not expected_output(shown).fullmatch("a (x, y)\nz\nextra\n")
    assert not expected_output("a …\n").fullmatch("a b\nc\n")  # `…` stays on its line


@pytest.mark.parametrize("block", SLOW_BLOCKS, ids=[b.where for b in SLOW_BLOCKS])
def test_slow_blocks_run_as_written(block: Block, tmp_path: Path, test_cache: Path) -> None:
    env = {**os.environ, "PATH": f"{REPO / '.venv/bin'}:{os.environ['PATH']}", "HOME": str(tmp_path)}
    for name in materials(block):
        env.update(MAKERS[name](tmp_path, test_cache))
    for cmd, shown in console_commands(block):
        run = subprocess.run(["bash", "-c", cmd + " 2>&1"], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=600)
        assert expected_output(shown + "\n").fullmatch(run.stdout), \
            f"{block.where}: $ {cmd}\n--- shown:\n{shown}\n--- printed:\n{run.stdout}"
