"""What layers above node/ attach to an activation, passed in by the front-ends.

node/ knows nothing of containers; join/ writes files (CDI specs, the containerd drop-in) that
must follow the active version. Instead of node/ importing join/, every activation is given an
`ActivationCallbacks`: `refusal` runs before anything changes (a reason to refuse, or None), `follow`
after the switch (what it rewrote, and notes), `removal` for `uninstall` (what join wrote on this
root, to remove or write back). `nodeprep.join.activation.CALLBACKS` is join's;
`NO_CALLBACKS` is for a caller that has nothing above the node (tests, benches of the node alone).
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


@dataclass(frozen=True)
class Undo:
    """One file a layer above the node wrote, undone by `uninstall`: deleted (`content` None) or
    written back (`content`: the file as it was before nodeprep edited it)."""

    target: str  # the node's path
    path: Path  # on this host (under the root)
    content: bytes | None = None
    mode: int = 0o644


@dataclass(frozen=True)
class Removal:
    """What `uninstall` undoes above the node: `undo` in order, `kept` one warning line per file at a
    path nodeprep writes that nodeprep did not write (left as it is), `restart` the units to restart
    on a live root once the files are gone, `stop` those to stop there (when active) before they go;
    `paths` every node path the layer writes on this root (present or not): a folder a record in the
    image names is trusted only above one of them (nodeprep.node.created)."""

    undo: tuple[Undo, ...] = ()
    kept: tuple[str, ...] = ()
    restart: tuple[str, ...] = ()
    stop: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()


def _no_removal(root: Path) -> Removal:
    del root
    return Removal()


def _no_refusal(root: Path) -> str | None:
    del root
    return None


def _no_follow(root: Path, version: str) -> FollowUp:
    del root, version
    return FollowUp()


@dataclass(frozen=True)
class ActivationCallbacks:
    refusal: Callable[[Path], str | None] = field(default=_no_refusal)
    follow: Callable[[Path, str], FollowUp] = field(default=_no_follow)
    removal: Callable[[Path], Removal] = field(default=_no_removal)


NO_CALLBACKS = ActivationCallbacks()
