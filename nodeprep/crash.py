"""Named crash points for the kill -9 tests.

`crash_point("activate:flipped")` kills the process with SIGKILL when the environment variable
NODEPREP_CRASH_AT equals that name. Tests use it to stop a real `nodeprep` process at a precise step
(deterministic, unlike a timer); in normal use the variable is unset and this is a dictionary lookup.
"""

from __future__ import annotations

import os
import signal

ENV = "NODEPREP_CRASH_AT"
POINTS: list[str] = []  # every name passed so far in this process (documentation and tests)


def crash_point(name: str) -> None:
    POINTS.append(name)
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
