"""Docs that cannot go stale (issue #28): every command block of README.md and docs/*.md either runs
here (`<!-- docs-test: run -->`, its shown output compared), runs in the slow tier with material the
suite has (`<!-- docs-test: slow: MATERIAL, ... -->`, tests/slow/test_docs_blocks.py), is run by a
named test (`<!-- docs-example: NAME -->`), is a usage synopsis (`<!-- docs-test: synopsis -->`) or
says why it cannot run here (`<!-- docs-test: skip: REASON -->`: a GPU, a cluster, the network, a
real build). A block with none fails. Whatever the marker, every `nodeprep …` command the docs show
(blocks and inline code) must name a real command and only its real, not deprecated, options (their
--help)."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from nodeprep.cli import main
from tests.support.docs import DOCS, MATERIALS, Block, blocks, command_lines, console_commands, materials
from tests.support.fixtures import REPO

COMMAND_BLOCKS = [b for doc in DOCS for b in blocks(doc) if b.is_command]
RUN_BLOCKS = [b for b in COMMAND_BLOCKS if b.kind == "run"]
INLINE = re.compile(r"`(nodeprep [^`]+)`")
SHORT = re.compile(r"`([a-z][a-z-]+(?: [a-z]+)? --[^`]*)`")  # `install --activate`: a command, no prefix
STOP = {"|", "||", "&&", ";", ">", "2>&1", "<"}


def test_every_command_block_runs_or_says_why() -> None:
    unmarked = [b.where for b in COMMAND_BLOCKS if b.kind is None]
    assert unmarked == [], "mark each: <!-- docs-test: run|synopsis|slow: MATERIAL|skip: REASON -->"
    assert all((b.marker["reason"] or "").strip() for b in COMMAND_BLOCKS if b.kind == "skip")
    for b in COMMAND_BLOCKS:  # the slow tier makes what a slow block names (tests/slow/test_docs_blocks.py)
        if b.kind == "slow":
            assert materials(b) and set(materials(b)) <= set(MATERIALS), f"{b.where}: {materials(b)}"
            assert b.lang == "console" or any(ln.startswith("$ ") for ln in b.body.splitlines()), b.where
    tests = "\n".join(p.read_text() for p in (REPO / "tests").rglob("*.py"))
    for b in COMMAND_BLOCKS:
        if b.kind == "example":
            name = b.marker["example"]
            assert f'documented_block("{b.doc}", "{name}")' in tests, f"{b.where}: no test runs {name}"


def _invocations(line: str) -> Iterator[list[str]]:
    """The argument lists of each `nodeprep` (or `.venv/bin/nodeprep`) call in a shell line."""
    words = line.split()
    for i, word in enumerate(words):
        if re.fullmatch(r"(?:\S*/)?nodeprep", word.lstrip("(`")):
            args = []
            for arg in words[i + 1:]:
                if arg in STOP or arg.startswith("#"):
                    break
                args.append(arg)
            yield args


def _options(cmd: click.Command) -> set[str]:
    """The options a command accepts as documented: --help's, not the hidden deprecated aliases."""
    return {o for p in cmd.params if isinstance(p, click.Option) and not p.hidden
            for o in (*p.opts, *p.secondary_opts)} | {"-h", "--help"}


def _problems(args: list[str]) -> list[str]:
    """What is wrong with `nodeprep ARGS` as documented: an unknown command, an option the command
    (or the group before it) does not have. Synopsis brackets and `a|b` alternatives are read."""
    cmd: click.Command = main
    path = ["nodeprep"]
    flags: list[str] = []
    problems: list[str] = []
    for word in (w.strip("[]") for w in args):
        if word.startswith("-"):
            flags += [f.split("=")[0].rstrip(".,)]") for f in re.split(r"[|/]", word) if f.startswith("-")]
            continue
        if isinstance(cmd, click.Group):
            names = word.split("/")  # `nodeprep install/activate/rollback` names several
            if len(names) > 1:
                return [f"nodeprep {n}: no such command" for n in names if n not in cmd.commands]
            if word not in cmd.commands:
                return [f"{' '.join(path)} {word}: no such command"]
            problems += [f"{' '.join(path)}: {f} is not one of its options" for f in flags
                         if f not in _options(cmd)]
            cmd, flags = cmd.commands[word], []
            path.append(word)
    return problems + [f"{' '.join(path)}: {f} is not one of its options" for f in flags
                       if f not in _options(cmd)]


def test_the_checker_finds_stale_commands() -> None:
    assert _problems(["install", "--driver-version", "1"]) == [
        "nodeprep install: --driver-version is not one of its options"]
    assert _problems(["join", "--dry-run"]) == ["nodeprep join: --dry-run is not one of its options"]
    assert _problems(["artifacts", "lst"]) == ["nodeprep artifacts lst: no such command"]
    assert _problems(["-v", "profile", "check", "[--profile", "FILE]", "[--root|--json]"]) == []


def test_documented_commands_and_flags_exist() -> None:
    problems = []
    for b in COMMAND_BLOCKS:
        for line in command_lines(b):
            for args in _invocations(line):
                problems += [f"{b.where}: {p}" for p in _problems(args)]
    for doc in DOCS:
        if doc == "docs/design-decisions.md":  # history: it names the flags a change retired
            continue
        for n, text in enumerate((REPO / doc).read_text().splitlines(), 1):
            for span in INLINE.findall(text):
                if re.match(r"nodeprep(?: \S+){0,2}:", span):  # a message nodeprep prints, not a command
                    continue
                problems += [f"{doc}:{n}: {p}" for p in _problems(span.split()[1:])]
            for span in SHORT.findall(text):
                if span.split()[0] in main.commands:
                    problems += [f"{doc}:{n}: {p}" for p in _problems(span.split())]
    assert not problems, "\n".join(problems)


TOP = (r"(?:nodeprep|tests|docs|scripts|acceptance|roles|playbooks|inventories|examples|images|bench"
       r"|collections)")
NOT_OURS = {"scripts/sign-file": "the kernel headers' signing script", "SPEC.md": "the CDI repository's"}


def test_files_the_docs_name_exist() -> None:
    """Links, repository paths (`nodeprep/…`, `tests/…`) and NAME.md files the docs cite."""
    missing = []
    for doc in DOCS:
        for n, line in enumerate((REPO / doc).read_text().splitlines(), 1):
            links = [(REPO / doc).parent / m for m in re.findall(r"\]\(([\w./-]+)(?:#[^)]*)?\)", line)]
            paths = [REPO / m for m in re.findall(rf"(?<![\w/.<-])({TOP}/[\w./-]*[\w/])", line)
                     if m not in NOT_OURS]
            mds = [m for m in re.findall(r"\b([A-Z][A-Z_-]+\.md)\b", line) if m not in NOT_OURS]
            missing += [f"{doc}:{n}: {p.relative_to(REPO) if p.is_relative_to(REPO) else p}"
                        for p in links + paths if not p.exists()]
            missing += [f"{doc}:{n}: {m}" for m in mds
                        if not (REPO / m).exists() and not (REPO / "docs" / m).exists()]
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=[b.where for b in RUN_BLOCKS])
def test_runnable_blocks_run_as_written(block: Block, tmp_path: Path) -> None:
    """In an empty directory that sees the checkout's examples/, with this checkout's nodeprep first
    on PATH: a console block's commands print what the doc shows, a shell block exits 0."""
    (tmp_path / "examples").symlink_to(REPO / "examples")
    env = {**os.environ, "PATH": f"{REPO / '.venv/bin'}:{os.environ['PATH']}", "HOME": str(tmp_path)}
    if block.lang != "console":
        run = subprocess.run(["bash", "-euo", "pipefail", "-c", block.body], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stdout + run.stderr
        return
    for cmd, shown in console_commands(block):
        run = subprocess.run(["bash", "-c", cmd + " 2>&1"], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=120)
        assert run.stdout.rstrip("\n") == shown, f"{block.where}: $ {cmd}"
