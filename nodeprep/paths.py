"""Default locations shared by every command (one place, so build, smoke test and the store
commands agree): the artifact store and the cache of downloads, build roots and compiled modules."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_STORE = Path("artifacts")  # build-driver publishes here; `artifacts list|verify` read it


def default_cache() -> Path:
    """`$NODEPREP_CACHE`, else `$XDG_CACHE_HOME/nodeprep`, else `~/.cache/nodeprep`."""
    if os.environ.get("NODEPREP_CACHE"):
        return Path(os.environ["NODEPREP_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "nodeprep"
