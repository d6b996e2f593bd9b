"""Verifying a directory store: every artifact against index.json, its manifest and the extraction
rules install applies (`nodeprep artifacts verify`, and before `artifacts push`)."""

from __future__ import annotations

from pathlib import Path

from .. import artifact
from ..errors import ArtifactError, NodeprepError


def check_store(path: Path) -> list[str]:
    """One line per problem in the store directory `path` (empty: all good). An index nodeprep
    cannot use (malformed, a field of the wrong type, a name that is not the artifact's file name,
    not a regular file) and a manifest it cannot read (artifact.MalformedManifest) are refused as
    install refuses them: ArtifactError (exit 2), not a problem line."""
    problems: list[str] = []
    entries = artifact.LocalStore(path).entries()
    listed = {e.name for e in entries}
    for e in entries:
        try:
            actual = artifact.sha256_listed(path, e.name)
        except ArtifactError as err:
            problems.append(f"{e.name}: {err}")
            continue
        if actual is None:
            problems.append(f"{e.name}: listed in {artifact.INDEX} but missing")
            continue
        f = path / e.name
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
            except artifact.MalformedManifest:
                raise
            except NodeprepError as err:
                problems.append(f"{e.name}: {err}")
    for f in sorted(path.glob("*.tar.zst")):
        if f.name not in listed:
            problems.append(f"{f.name}: not listed in {artifact.INDEX}")
    return problems
