"""The one subprocess helper. No other module imports subprocess (a test enforces it).

- argv lists only, never a shell; every element goes through os.fspath;
- stdin is /dev/null unless `input` is given; the environment is minimal (LC_ALL=C) plus `env`,
  with HOME, TMPDIR and the proxy variables passed through; `sealed`: exactly `env` (a container
  hook's children: nothing of the environment the hook was started with);
- `root` runs the command inside that directory with chroot(8);
- `timeout` is seconds; on expiry the whole process group is killed and CommandError raised;
- `on_line` streams combined output line by line (compile progress), optionally teed to `log_path`;
- failures raise CommandError with the last lines of output, a missing tool says "<tool> not found".
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import CommandError

log = logging.getLogger(__name__)

Arg = str | os.PathLike[str]
TAIL_LINES = 20
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LC_ALL": "C",
    "LANG": "C",
}


@dataclass(frozen=True)
class Result:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str


def _argv(argv: Sequence[Arg], root: Path | None) -> list[str]:
    args = [os.fspath(a) for a in argv]
    if root is not None and Path(root).resolve() != Path("/"):
        args = ["chroot", os.fspath(root), *args]
    return args


def _env(env: Mapping[str, str] | None, inherit: bool, sealed: bool = False) -> dict[str, str]:
    if sealed:
        return dict(env or {})
    base = dict(os.environ) if inherit else dict(BASE_ENV)
    if not inherit:
        for key in ("HOME", "TMPDIR", "http_proxy", "https_proxy", "no_proxy", "SOURCE_DATE_EPOCH"):
            if key in os.environ:
                base[key] = os.environ[key]
    base.update(env or {})
    return base


def run(
    argv: Sequence[Arg],
    *,
    check: bool = True,
    capture: bool = True,
    timeout: float | None = None,
    cwd: Arg | None = None,
    env: Mapping[str, str] | None = None,
    inherit_env: bool = False,
    sealed: bool = False,
    root: Path | None = None,
    input: str | bytes | None = None,
    on_line: Callable[[str], None] | None = None,
    log_path: Path | None = None,
) -> Result:
    """Run argv and return its Result; raise CommandError on failure when `check`."""
    if sealed and inherit_env:
        raise ValueError("sealed and inherit_env exclude each other")
    args = _argv(argv, root)
    log.debug("+ %s", shlex.join(args))
    full_env = _env(env, inherit_env, sealed)
    if on_line is not None or log_path is not None:
        return _run_streaming(args, check=check, timeout=timeout, cwd=cwd, env=full_env,
                              on_line=on_line, log_path=log_path)
    try:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.PIPE if capture else None,
            cwd=os.fspath(cwd) if cwd is not None else None,
            env=full_env,
            start_new_session=True,
        )
    except FileNotFoundError:
        raise CommandError(args, 127, message=f"{args[0]} not found") from None
    try:
        stdout, stderr = proc.communicate(input.encode() if isinstance(input, str) else input,
                                          timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        stdout, stderr = proc.communicate()
        raise CommandError(args, -1, tail=_tail(_decode(stderr or stdout)),
                           message=f"{args[0]} timed out after {timeout:g}s") from None
    except BaseException:
        _kill_group(proc)
        proc.wait()
        raise
    out, err = _decode(stdout), _decode(stderr)
    result = Result(args, proc.returncode, out, err)
    if check and proc.returncode != 0:
        if proc.returncode == 127 and "not found" in err:
            raise CommandError(args, 127, message=f"{args[0]} not found")
        raise CommandError(args, proc.returncode, tail=_tail(err or out))
    return result


def _run_streaming(
    args: list[str],
    *,
    check: bool,
    timeout: float | None,
    cwd: Arg | None,
    env: dict[str, str],
    on_line: Callable[[str], None] | None,
    log_path: Path | None,
) -> Result:
    tail: deque[str] = deque(maxlen=400)
    logf = open(log_path, "w", encoding="utf-8", errors="replace") if log_path else None  # noqa: SIM115
    try:
        try:
            proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                cwd=os.fspath(cwd) if cwd is not None else None, env=env, start_new_session=True,
            )
        except FileNotFoundError:
            raise CommandError(args, 127, message=f"{args[0]} not found") from None
        timer = None
        if timeout is not None:
            timer = threading.Timer(timeout, _kill_group, (proc,))
            timer.start()
        try:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                tail.append(line)
                if logf:
                    logf.write(line + "\n")
                if on_line:
                    on_line(line)
            rc = proc.wait()
        except BaseException:
            _kill_group(proc)
            proc.wait()
            raise
        finally:
            if timer:
                timer.cancel()
    finally:
        if logf:
            logf.close()
    out = "\n".join(tail)
    if (timeout is not None and rc in (-signal.SIGKILL, 128 + signal.SIGKILL)
            and timer and not timer.is_alive()):
        raise CommandError(args, rc, tail=_tail(out), log_path=str(log_path) if log_path else None,
                           message=f"{args[0]} timed out after {timeout:g}s")
    if check and rc != 0:
        raise CommandError(args, rc, tail=_tail(out), log_path=str(log_path) if log_path else None)
    return Result(args, rc, out, "")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _decode(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode("utf-8", "replace")


def _tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def which(tool: str) -> str | None:
    """Path of `tool` on PATH (BASE_ENV's PATH included), or None."""
    # lazy: import nodeprep.labels.gpu
    import shutil

    return shutil.which(tool) or shutil.which(tool, path=BASE_ENV["PATH"])
