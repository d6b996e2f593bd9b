"""docs/cloud.md's "Try it" block, run exactly as written in a copy of this checkout: the wheel is
built offline (no setuptools warnings: pyproject's SPDX licence), `nodeprep cloud-init` renders the
annotated examples/node.yaml with it, and the real `cloud-init schema -c` accepts the result; the
user-data pins the wheel's sha256 at the example store's URL."""

from __future__ import annotations

import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import yaml

from nodeprep import __version__
from nodeprep.digests import sha256_file
from tests.support.docs import documented_block
from tests.support.fixtures import REPO

from .test_cloudinit_render import cloud_init

_IGNORE_ANYWHERE = shutil.ignore_patterns("*.egg-info", "__pycache__")
_TOP_LEVEL = {".venv", ".git", "build", "dist", "artifacts", ".pytest_cache", ".ruff_cache", "user-data",
              "token"}


def COPY_IGNORE(directory: str, names: list[str]) -> set[str]:  # noqa: N802 (shutil.copytree's ignore)
    """What a copy of the checkout leaves out: build output and caches at the top (nodeprep/builder/ is
    the library's package, not output), byte code and egg-info anywhere."""
    top = {n for n in names if n in _TOP_LEVEL} if Path(directory) == REPO else set()
    return top | set(_IGNORE_ANYWHERE(directory, names))


def test_cloud_md_example_renders_valid_user_data(tmp_path: Path) -> None:
    cloud_init()  # fails clearly without Debian's cloud-init (scripts/deps/cloud.apt)
    block = documented_block("docs/cloud.md", "cloud-init")
    work = tmp_path / "checkout"
    shutil.copytree(REPO, work, ignore=COPY_IGNORE, symlinks=True)
    (work / ".venv").symlink_to(REPO / ".venv")  # what scripts/setup.sh made
    before = {p for p in work.rglob("*") if p.is_file()}
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=work, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Valid cloud-config: dist/user-data" in run.stdout
    assert "Warning" not in run.stderr and "project.license" not in run.stderr, run.stderr

    (wheel,) = (work / "dist").glob("nodeprep-*-py3-none-any.whl")
    assert wheel.name == f"nodeprep-{__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        metadata = z.read(f"nodeprep-{__version__}.dist-info/METADATA").decode()
        assert "nodeprep/cli.py" in z.namelist() and "nodeprep/builder/driver.py" in z.namelist()
        assert "nodeprep/data/install-nodeprep.sh" in z.namelist()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
    assert (work / "dist/token").stat().st_mode & 0o077 == 0
    made = sorted(str(p.relative_to(work)) for p in work.rglob("*") if p.is_file() and p not in before)
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *made], cwd=work, capture_output=True,
                             text=True).stdout.split()
    assert made and ignored == made  # the recipe leaves nothing in the checkout that git would pick up

    user_data = (work / "dist/user-data").read_bytes()
    doc = (REPO / "docs/cloud.md").read_text()
    shown = re.search(r"examples/node\.yaml \(4 KB of comments\)\s+([\d.]+) KB", doc)
    assert shown and abs(len(user_data) / 1000 - float(shown[1])) < 0.3, (len(user_data), shown)
    data = yaml.safe_load(user_data)
    first = data["runcmd"][0]
    url = f"https://artifacts.example.com/nvidia/tools/{wheel.name}"
    assert first[2:] == ["store", url, sha256_file(wheel)]
    files = {f["path"]: f for f in data["write_files"]}
    assert files["/etc/nodeprep/bootstrap-token"]["permissions"] == "0600"
