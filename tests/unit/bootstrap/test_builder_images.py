"""images/<os>/Containerfile: parsed (no container engine here) and checked against the contract of
`build-driver --builder podman|docker` (nodeprep/builder/containerbuild.py: context images/<os>/, the
repository mounted at /src, `python3 -m nodeprep.cli`): every image starts FROM and provides python3;
the Ubuntu/RHEL builders declare ARG KERNEL_RELEASE in the build stage, install that kernel's
headers, gcc and make, a python3 >= 3.11 with nodeprep's dependencies, copy nothing from the
context, and say in a comment header what they install."""

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


DEPS = ("click", "yaml", "jinja2", "requests", "zstandard", "jsonschema", "tomli-w")


def run_text(text: str) -> str:
    return " ".join(a for k, a in instructions(text) if k == "RUN")


@pytest.mark.parametrize("path", containerfiles(), ids=lambda p: p.parent.name)
def test_every_image_starts_from_and_has_python3(path: Path) -> None:
    ins = instructions(path.read_text())
    kinds = [k for k, _ in ins]
    assert "FROM" in kinds, "no FROM"
    assert all(k == "ARG" for k in kinds[: kinds.index("FROM")]), "only ARG may come before FROM"
    assert re.search(r"(?<![\w-])python3(\.1[1-9])?(?![\w-])", run_text(path.read_text())), "python3"


@pytest.mark.parametrize("name", OURS)
def test_kernel_builder_contract(name: str) -> None:
    text = (IMAGES / name / "Containerfile").read_text()
    ins = instructions(text)
    kinds = [k for k, _ in ins]
    stage = ins[kinds.index("FROM") + 1:]
    args = [a.split("=")[0].strip() for k, a in stage if k == "ARG"]
    assert "KERNEL_RELEASE" in args, "ARG KERNEL_RELEASE must be declared after FROM (build stage scope)"
    run = run_text(text)
    assert re.search(r"(linux-headers|kernel-devel)-\$\{?KERNEL_RELEASE\}?", run), "exact kernel headers"
    assert re.search(r"(?<![\w-])gcc(-\$\{?\w+\}?|-\d+)?(?![\w.-])", run), "gcc"
    assert re.search(r"(?<![\w-])make(?![\w-])", run), "make"
    assert 'test -n "${KERNEL_RELEASE}"' in run, "a missing KERNEL_RELEASE must fail the build at once"
    # the build context is images/<os>/: nothing of the repository can be copied in
    assert not [a for k, a in ins if k in ("COPY", "ADD")]
    assert ("WORKDIR", "/src") in ins
    for dep in DEPS:
        assert dep in run, f"nodeprep dependency {dep} is not installed"
    head = header(text)
    assert "Installs:" in head and "KERNEL_RELEASE" in head and "Build" in head and "/src" in head
    if name.startswith("rhel"):
        for pkg in ("gcc", "make", "elfutils-libelf-devel", "kernel-devel-${KERNEL_RELEASE}"):
            assert pkg in run.split(), pkg
    else:
        # the compiler the kernel was built with, read from the headers' .config
        assert "CONFIG_GCC_VERSION" in run and "gcc-${gcc_major}" in run
    if "python3.11" in run:
        env = " ".join(a for k, a in ins if k == "ENV")
        assert "PATH=/opt/nodeprep/bin:" in env, "the venv's python3 must come first on PATH"


def test_parser_rejects_what_it_should() -> None:
    bad = "# header\nRUN apt-get install -y gcc make linux-headers-${KERNEL_RELEASE}\n"
    assert "FROM" not in [k for k, _ in instructions(bad)]
    text = "ARG KERNEL_RELEASE\nFROM debian:12\nRUN apt-get install -y \\\n  gcc make\n"
    ins = instructions(text)
    assert ins == [("ARG", "KERNEL_RELEASE"), ("FROM", "debian:12"), ("RUN", "apt-get install -y gcc make")]
