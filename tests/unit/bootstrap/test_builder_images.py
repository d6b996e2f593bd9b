"""images/<os>/Containerfile: parsed (no container engine here) and checked against the contract the
driver build's --builder relies on: FROM, ARG KERNEL_RELEASE in the build stage, the exact kernel's
headers, gcc, make, nodeprep installed, and a comment header saying what the image installs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

IMAGES = Path(__file__).resolve().parents[3] / "images"
OURS = ("ubuntu-22.04", "ubuntu-24.04", "rhel-9")


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1].rstrip() + " "
            continue
        buf += stripped
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    assert not buf, "dangling line continuation at the end of the file"
    return out


def header(text: str) -> str:
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return "\n".join(lines)


def containerfiles() -> list[Path]:
    return sorted(IMAGES.glob("*/Containerfile"))


def test_every_target_os_has_a_definition() -> None:
    names = {p.parent.name for p in containerfiles()}
    assert set(OURS) <= names
    readme = (IMAGES / "README.md").read_text()
    for name in names:
        assert f"`{name}/Containerfile`" in readme, f"images/README.md does not describe {name}"


@pytest.mark.parametrize("path", containerfiles(), ids=lambda p: p.parent.name)
def test_builder_contract(path: Path) -> None:
    ins = instructions(path.read_text())
    kinds = [k for k, _ in ins]
    assert "FROM" in kinds, "no FROM"
    first_from = kinds.index("FROM")
    assert all(k == "ARG" for k in kinds[:first_from]), "only ARG may come before FROM"
    stage = ins[first_from + 1:]
    args = [a.split("=")[0].strip() for k, a in stage if k == "ARG"]
    assert "KERNEL_RELEASE" in args, "ARG KERNEL_RELEASE must be declared after FROM (build stage scope)"
    run = " ".join(a for k, a in stage if k == "RUN")
    assert re.search(r"(linux-headers|kernel-devel)-\$\{?KERNEL_RELEASE\}?", run), "exact kernel headers"
    assert re.search(r"(?<![\w-])gcc(-\$\{?\w+\}?|-\d+)?(?![\w.-])", run), "gcc"
    assert re.search(r"(?<![\w-])make(?![\w-])", run), "make"


@pytest.mark.parametrize("name", OURS)
def test_ours_install_nodeprep_and_document_it(name: str) -> None:
    text = (IMAGES / name / "Containerfile").read_text()
    head = header(text)
    assert "Installs:" in head and "KERNEL_RELEASE" in head and "Build" in head
    stage_run = " ".join(a for k, a in instructions(text) if k == "RUN")
    assert re.search(r"pip install .*?/usr/src/nodeprep", stage_run)
    assert "nodeprep --version" in stage_run
    assert ("COPY", ". /usr/src/nodeprep") in instructions(text)
    if name.startswith("rhel"):
        for pkg in ("gcc", "make", "elfutils-libelf-devel", "kernel-devel-${KERNEL_RELEASE}"):
            assert pkg in stage_run.split(), pkg
    else:
        # the compiler the kernel was built with, read from the headers' .config
        assert "CONFIG_GCC_VERSION" in stage_run and "gcc-${gcc_major}" in stage_run


def test_parser_rejects_what_it_should() -> None:
    bad = "# header\nRUN apt-get install -y gcc make linux-headers-${KERNEL_RELEASE}\n"
    assert "FROM" not in [k for k, _ in instructions(bad)]
    text = "ARG KERNEL_RELEASE\nFROM debian:12\nRUN apt-get install -y \\\n  gcc make\n"
    ins = instructions(text)
    assert ins == [("ARG", "KERNEL_RELEASE"), ("FROM", "debian:12"), ("RUN", "apt-get install -y gcc make")]
