"""The subprocess helper, against real processes."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import pytest

from nodeprep import runner
from nodeprep.errors import CommandError

PKG = Path(__file__).resolve().parents[2] / "nodeprep"


def test_captures_output_and_uses_minimal_env() -> None:
    r = runner.run(["sh", "-c", "echo out; echo err >&2; echo $LC_ALL"])
    assert r.stdout.split() == ["out", "C"] and r.stderr.strip() == "err"


def test_failure_carries_tail_and_code() -> None:
    with pytest.raises(CommandError) as e:
        runner.run(["sh", "-c", "for i in $(seq 1 50); do echo line$i >&2; done; exit 3"])
    assert e.value.returncode == 3
    assert str(e.value) == "sh failed with exit code 3"
    assert e.value.tail.splitlines() == [f"line{i}" for i in range(31, 51)]


def test_missing_tool_is_one_line() -> None:
    with pytest.raises(CommandError, match="^no-such-tool-xyz not found$"):
        runner.run(["no-such-tool-xyz"])


@pytest.mark.parametrize("stream", [False, True], ids=["captured", "streaming"])
def test_timeout_kills_the_process_group(tmp_path: Path, stream: bool) -> None:
    pidfile = tmp_path / "bg.pid"
    with pytest.raises(CommandError, match="timed out after 0.5s"):
        runner.run(["sh", "-c", f"sleep 30 & echo $! > {pidfile}; sleep 30"], timeout=0.5,
                   on_line=(lambda _line: None) if stream else None)
    pid = int(pidfile.read_text())
    for _ in range(50):  # the orphan is reaped by init shortly after SIGKILL
        stat = Path(f"/proc/{pid}/stat")
        if not stat.exists() or stat.read_text().split()[2] == "Z":
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"background child {pid} survived the timeout")


def test_streaming_lines_and_log(tmp_path: Path) -> None:
    seen: list[str] = []
    log = tmp_path / "build.log"
    r = runner.run(["sh", "-c", "echo a; echo b >&2; echo c"], on_line=seen.append, log_path=log)
    assert seen == ["a", "b", "c"] and log.read_text() == "a\nb\nc\n" and r.returncode == 0
    with pytest.raises(CommandError, match=f"full log: {log}"):
        runner.run(["sh", "-c", "echo boom; exit 2"], log_path=log)


def test_only_runner_imports_subprocess() -> None:
    offenders = []
    for path in PKG.rglob("*.py"):
        if path.name == "runner.py" and path.parent == PKG:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n.split(".")[0] == "subprocess" for n in names):
                offenders.append(str(path.relative_to(PKG.parent)))
    assert offenders == [], "use nodeprep.runner.run instead of subprocess"
    assert not [p for p in PKG.rglob("*.py") if "shell=True" in p.read_text()]
