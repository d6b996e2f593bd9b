"""nodeprep.atomicfile under its former name, for importers not moved yet: the one atomic writer
lives in nodeprep/atomicfile.py (the edges floor, so that every floor can use it)."""

from __future__ import annotations

from ..atomicfile import (
    atomic_stream,
    atomic_symlink,
    atomic_write,
    clean_temporaries,
    fsync_dir,
    fsync_tree,
    holds,
    open_temp,
    publish_file,
    relative_target,
    temp_name,
)

__all__ = ["atomic_stream", "atomic_symlink", "atomic_write", "clean_temporaries", "fsync_dir", "fsync_tree",
           "holds", "open_temp", "publish_file", "relative_target", "temp_name"]
