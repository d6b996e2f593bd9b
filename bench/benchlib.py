"""What every bench shares (bench/README.md): the interpreter, the exit convention and the raw
`make modules` baseline of the build benches.

    0  every goal met          1  a goal missed (all results still printed)
    2  bad arguments (argparse) 3  cannot measure here (not root, a prerequisite missing, a step failed)

`use_venv()` re-runs the bench under the checkout's .venv (made by scripts/setup.sh) when it was
started with another interpreter, so `python3 bench/X.py` works as documented.
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / ".venv"
MET, MISSED, USAGE, CANNOT = 0, 1, 2, 3


def use_venv() -> None:
    """exec the running bench under .venv/bin/python unless it already runs there (or has no .venv)."""
    python = VENV / "bin" / "python"
    if Path(sys.prefix).resolve() == VENV.resolve() or not python.exists():
        return
    os.execv(python, [str(python), *sys.argv])


def cannot_measure(why: str) -> NoReturn:
    print(f"bench: cannot measure here: {why}", file=sys.stderr)
    raise SystemExit(CANNOT)


@dataclass
class Goals:
    """Goals checked in one run; `check` gives the verdict word to print, `exit_code` the result."""

    missed: list[str] = field(default_factory=list)
    met: list[str] = field(default_factory=list)

    def check(self, name: str, ok: bool) -> str:
        (self.met if ok else self.missed).append(name)
        return "OK" if ok else "MISSED"

    def at_most(self, name: str, value: float, goal: float) -> str:
        return self.check(name, value <= goal)

    def at_least(self, name: str, value: float, goal: float) -> str:
        return self.check(name, value >= goal)

    def exit_code(self) -> int:
        """Prints the closing `goals:` line; 0 when every goal was met, else 1."""
        total = len(self.met) + len(self.missed)
        if self.missed:
            print(f"goals: {len(self.missed)} of {total} missed ({', '.join(self.missed)})")
            return MISSED
        print(f"goals: all {total} met")
        return MET


def run(main: Callable[[], int]) -> NoReturn:
    """Run a bench's main(): its code on return; an exception (a step failed) is printed and exits 3."""
    try:
        code = main()
    except SystemExit as e:
        if not isinstance(e.code, str):
            raise
        print(e.code, file=sys.stderr)  # raise SystemExit("why"): a step failed
        code = CANNOT
    except KeyboardInterrupt:
        raise
    except Exception:  # noqa: BLE001 - reported, and the exit code says the run measured nothing
        traceback.print_exc()
        print("bench: a step failed, nothing measured", file=sys.stderr)
        code = CANNOT
    sys.exit(code)


def children_cpu() -> float:
    """CPU seconds (user + system) of every finished child of this process and their children."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def raw_make(req: Any, jobs: int) -> tuple[Any, Callable[[], tuple[float, float]]]:
    """The baseline of the build benches for builder.resolve.BuildRequest `req`: (its resolved inputs, a
    function that clones the cached build root, puts the kernel headers and driver sources in (not timed) and
    runs ONLY `make modules`, returning (wall s, CPU s of make and its children)). The inputs and the build
    root are resolved once, here."""
    from nodeprep import runner
    from nodeprep.builder import buildroot, headers, kbuild
    from nodeprep.builder.compile import place_sources
    from nodeprep.builder.resolve import open_archive, resolve_inputs

    archive = open_archive(req)
    resolved, run_path = resolve_inputs(req, archive)
    build_root = buildroot.ensure(
        buildroot.recipe_for(req.target, req.kernel),
        req.cache,
        mirror=archive.mirror,
        security_mirror=archive.security_mirror,
    )

    def once() -> tuple[float, float]:
        with buildroot.workspace(build_root, req.cache / "tmp") as clone:
            scratch = Path(tempfile.mkdtemp(prefix="scratch.", dir=clone.parent))
            for pkg, _ in resolved.header_packages:
                stage = Path(tempfile.mkdtemp(prefix="stage.", dir=scratch))
                runner.run(["dpkg-deb", "-x", resolved.debs[pkg], stage])
                headers.install_into(stage, clone)
            place_sources(resolved, run_path, clone, scratch)  # (ours reuses a cached headers layer)
            t, c = time.monotonic(), children_cpu()
            runner.run(
                kbuild.make_argv(resolved.kernel_release, jobs),
                root=clone,
                env=kbuild.REPRODUCIBLE_ENV,
                timeout=kbuild.MAKE_TIMEOUT,
                log_path=scratch / "raw.log",
            )
            return time.monotonic() - t, children_cpu() - c

    return resolved, once
