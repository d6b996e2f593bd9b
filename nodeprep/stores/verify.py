"""Verifying a directory store: every artifact against index.json, its manifest and the extraction
rules install applies (`nodeprep artifacts verify`, and before `artifacts push`)."""

from __future__ import annotations

from pathlib import Path

from .. import artifact
from ..errors import NodeprepError


def verify_store(path: Path) -> list[str]:
    """One line per problem in the store directory `path` (empty: all good)."""
    problems: list[str] = []
    try:
        entries = artifact.LocalStore(path).entries()
    except NodeprepError as e:
        return [str(e)]
    listed = {e.name for e in entries}
    for e in entries:
        f = path / e.name
        if not f.is_file():
            problems.append(f"{e.name}: listed in {artifact.INDEX} but missing")
            continue
        actual = artifact.sha256_file(f)
        if actual != e.sha256:
            problems.append(
                f"{e.name}: sha256 {actual[:16]}… does not match {artifact.INDEX} ({e.sha256[:16]}…)"
            )
        problems += [f"{e.name}: {p}" for p in artifact.verify(f)]
        if not any(p for p in problems if p.startswith(e.name)):
            try:
                m = artifact.read_manifest(f)
                if m.input_digest != e.input_digest:
                    problems.append(f"{e.name}: manifest input digest differs from {artifact.INDEX}")
            except NodeprepError as err:
                problems.append(f"{e.name}: {err}")
    for f in sorted(path.glob("*.tar.zst")):
        if f.name not in listed:
            problems.append(f"{f.name}: not listed in {artifact.INDEX}")
    return problems
