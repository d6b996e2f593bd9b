"""What layers above node/ attach to an activation, passed in by the front-ends.

node/ knows nothing of containers; join/ writes files (CDI specs, the containerd drop-in) that
must follow the active version. Instead of node/ importing join/, every activation is given an
`ActivationHooks`: `refusal` runs before anything changes (a reason to refuse, or None), `follow`
after the switch (what it rewrote, and notes). `nodeprep.join.activation.HOOKS` is join's;
`NO_HOOKS` is for a caller that has nothing above the node (tests, benches of the node alone).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class FollowUp:
    """What `follow` did: files rewritten for the new version (each a change), and report lines."""

    rewritten: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def _no_refusal(root: Path) -> str | None:
    del root
    return None


def _no_follow(root: Path, version: str) -> FollowUp:
    del root, version
    return FollowUp()


@dataclass(frozen=True)
class ActivationHooks:
    refusal: Callable[[Path], str | None] = field(default=_no_refusal)
    follow: Callable[[Path, str], FollowUp] = field(default=_no_follow)


NO_HOOKS = ActivationHooks()
