"""The repository boundary at run time: an audit hook that records every path a test process opens,
lists or runs beside the repository (under its parent directory but outside it).

A lone clone must pass its tests, so nothing may read a sibling of the checkout (a fixtures
folder next to it, another checkout). Paths elsewhere (/tmp, /usr, /proc, the test cache under
/var/cache) are fine: only the repository's sibling tree is forbidden, except a path the
environment names on purpose (a `NODEPREP_*` variable, e.g. a CI setting that points tests at
reference data beside the checkout; without it those tests skip). tests/conftest.py installs the hook
for the whole session and fails the test during which a forbidden path was touched.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

# audit events whose first argument is a path (https://docs.python.org/3/library/audit_events.html)
PATH_EVENTS = frozenset({"open", "os.listdir", "os.scandir", "os.chdir", "os.rename", "os.remove",
                         "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.truncate", "shutil.copyfile",
                         "shutil.copytree", "shutil.rmtree"})


class Guard:
    """Records paths under `repo.parent` but outside `repo`, seen in audit events."""

    def __init__(self, repo: Path, allowed: tuple[str, ...] = ()) -> None:
        self.repo = os.path.abspath(repo)
        self.parent = os.path.dirname(self.repo)
        self.allowed = tuple(os.path.normpath(a) for a in allowed)
        self.hits: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._local = threading.local()

    def forbidden(self, path: str) -> str | None:
        """The absolute path when `path` (relative: against the cwd) is the repository's parent or in
        its sibling tree, else None."""
        if self.parent in ("", "/"):
            return None
        full = os.path.normpath(os.path.join(os.getcwd(), path))
        if full != self.parent and not full.startswith(self.parent + os.sep):
            return None
        for inside in (self.repo, *self.allowed):
            if full == inside or full.startswith(inside + os.sep):
                return None
        return full

    def _paths(self, event: str, args: tuple[object, ...]) -> list[str]:
        if event == "os.symlink":
            candidates = args[1:2]  # the link; its target is text, resolved (if ever) by a later open
        elif event in PATH_EVENTS:
            candidates = args[:2] if event in ("os.rename", "os.link", "shutil.copyfile",
                                               "shutil.copytree") else args[:1]
        elif event == "subprocess.Popen":
            argv = args[1] if len(args) > 1 else ()
            candidates = tuple(argv) if isinstance(argv, (list, tuple)) else (argv,)
            candidates += (args[2],) if len(args) > 2 else ()
        else:
            return []
        out = []
        for c in candidates:
            if isinstance(c, os.PathLike):
                c = os.fspath(c)
            if isinstance(c, bytes):
                c = os.fsdecode(c)
            if not isinstance(c, str) or not c:
                continue
            if event == "subprocess.Popen" and not (c.startswith(os.sep) and os.path.lexists(c)):
                continue  # argv strings: only existing absolute paths (a container's /work is not ours)
            full = self.forbidden(c)
            if full:
                out.append(full)
        return out

    def hook(self, event: str, args: tuple[object, ...]) -> None:
        if getattr(self._local, "busy", False):  # never recurse (os.getcwd, lexists inside the hook)
            return
        self._local.busy = True
        try:
            for path in self._paths(event, args):
                with self._lock:
                    self.hits.append((event, path))
        except Exception:  # noqa: BLE001  an audit hook must never break the audited call
            pass
        finally:
            self._local.busy = False

    def take(self) -> list[tuple[str, str]]:
        """The hits so far, cleared."""
        with self._lock:
            hits, self.hits = self.hits, []
        return hits


def allowed_by_env(environ: dict[str, str] | os._Environ[str]) -> tuple[str, ...]:
    """Absolute paths named by NODEPREP_* variables (PATH-style lists too): explicitly configured."""
    out = []
    for key, value in environ.items():
        if key.startswith("NODEPREP_"):
            out += [os.path.abspath(v) for v in value.split(os.pathsep) if v.startswith(os.sep)]
    return tuple(out)


def install(repo: Path) -> Guard:
    guard = Guard(repo, allowed_by_env(os.environ))
    sys.addaudithook(guard.hook)
    return guard
