"""Shell blocks of the docs that tests run as written (marked `<!-- docs-example: NAME -->`)."""

from __future__ import annotations

import re
from collections.abc import Iterator

from tests.support.fixtures import REPO


def documented_block(doc: str, name: str) -> str:
    """The ```sh block right after `<!-- docs-example: NAME -->` in REPO/doc."""
    text = (REPO / doc).read_text()
    marker = f"<!-- docs-example: {name} -->"
    m = re.search(re.escape(marker) + r"\s*```sh\n(.*?)```", text, re.S)
    assert m, f"{doc}: no sh block after {marker}"
    return m.group(1)


DOCS = ("README.md", "acceptance/gpu/README.md",
        *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")))
SHELL_LANGS = ("sh", "console", "bash", "shell")
COMMAND_START = re.compile(
    r"^(?:nodeprep|ansible-playbook|python3?|scripts/\S+|acceptance/\S+|\.venv/bin/\S+) ")
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[a-z]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                   re.S | re.M)
MARKER = re.compile(r"^\s*<!-- (?:docs-test: (?P<kind>run|synopsis|skip|slow)(?:: (?P<reason>.*?))?|"
                    r"docs-example: (?P<example>[\w-]+)) -->\s*$")
# What a `<!-- docs-test: slow: MATERIAL, ... -->` block may ask for: material the suite already has,
# made by the slow tier's runner (tests/slow/test_docs_blocks.py) in the block's working directory.
MATERIALS = {
    "store": "./artifacts: a store of small real artifacts, 535.309.01 for 6.1.0-28-amd64 "
             "(tests/support/standin.py)",
    "image-root": "$ROOT: an empty directory standing for an image's root",
    "real-build": "./nvidia-kmod-…, ./nvidia-userspace-…: the slow tier's shared real build "
                  "(tests/support/realbuild.py, a cache hit: no compile), with $NODEPREP_CACHE its cache "
                  "(kernels, build roots: nothing downloaded again)",
    "open-build": "./nvidia-kmod-…, ./nvidia-userspace-…: the debian12-open cell's build (Debian 12's "
                  "open modules, tests/support/realbuild.py CELLS, a cache hit), with $NODEPREP_CACHE "
                  "its cache",
}


def materials(block: Block) -> list[str]:
    """The materials a `slow` block names (its marker's reason: comma-separated names)."""
    return [m.strip() for m in (block.marker["reason"] or "").split(",") if m.strip()] if block.marker else []


class Block:
    """One fenced block of a doc: where it is, its language, its text (dedented) and the marker
    comment on the line before it (`<!-- docs-test: run|synopsis|skip: REASON -->`,
    `<!-- docs-test: slow: MATERIAL, ... -->` or
    `<!-- docs-example: NAME -->`), if any."""

    def __init__(self, doc: str, line: int, lang: str, body: str, marker: re.Match[str] | None) -> None:
        self.doc, self.line, self.lang, self.body, self.marker = doc, line, lang, body, marker

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def is_command(self) -> bool:
        """A shell block, or one whose lines are commands (`$ cmd` or a `nodeprep …` synopsis)."""
        lines = self.body.splitlines()
        return self.lang in SHELL_LANGS or any(ln.startswith("$ ") for ln in lines) or bool(
            lines and COMMAND_START.match(lines[0]))

    @property
    def kind(self) -> str | None:
        if self.marker is None:
            return None
        return "example" if self.marker["example"] else self.marker["kind"]


def blocks(doc: str) -> list[Block]:
    """Every fenced block of REPO/doc, in order."""
    text = (REPO / doc).read_text()
    out = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        indent = m["indent"]
        body = "".join(ln[len(indent):] if ln.startswith(indent) else ln
                       for ln in m["body"].splitlines(keepends=True))
        out.append(Block(doc, text[: m.start()].count("\n") + 1, m["lang"], body, MARKER.match(before)))
    return out


def command_lines(block: Block) -> list[str]:
    """The commands a block shows, continuation lines joined: `$ ` lines of a console block, every
    line but comments of a shell block, `nodeprep …` lines of a synopsis with their `[…]` lines."""
    out: list[str] = []
    joining = False
    for raw in block.body.splitlines():
        line = raw.rstrip()
        if joining:
            out[-1] += " " + line.strip().rstrip("\\")
        elif line.startswith("$ "):
            out.append(line[2:].rstrip("\\"))
        elif block.lang in ("sh", "bash", "shell") and line.strip() and not line.lstrip().startswith("#"):
            out.append(line.strip().rstrip("\\"))
        elif COMMAND_START.match(line):
            out.append(line.rstrip("\\"))
        elif out and block.kind == "synopsis" and line.lstrip().startswith("["):
            out[-1] += " " + re.split(r"\s{2,}", line.strip())[0]  # without the description
        joining = line.endswith("\\")
    return out


def expected_output(shown: str) -> re.Pattern[str]:
    """What a console block's shown output allows: each line as written, except a line `...` (any
    lines, none included) and `…` inside a line (any text on that line)."""
    parts = []
    for line in shown.splitlines():
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(r"[^\n]*?".join(re.escape(piece) for piece in line.split("…")) + r"\n")
    return re.compile("".join(parts))


def console_commands(block: Block) -> Iterator[tuple[str, str]]:
    """(command, the output shown after it) for each `$ ` line of a console block."""
    cmd, out = None, []
    for line in block.body.splitlines():
        if line.startswith("$ "):
            if cmd is not None:
                yield cmd, "\n".join(out)
            cmd, out = line[2:], []
        else:
            out.append(line)
    if cmd is not None:
        yield cmd, "\n".join(out)
