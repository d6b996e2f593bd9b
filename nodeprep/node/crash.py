"""nodeprep.crash under its former name, for importers not moved yet (the crash points sit on the
edges floor with the atomic writer that names them)."""

from __future__ import annotations

from ..crash import ENV, POINTS, crash_point

__all__ = ["ENV", "POINTS", "crash_point"]
