"""`nodeprep bootstrap`: one-shot node bring-up as a list of resumable steps.

The steps (nodeprep/bootstrap/steps.py) run on the generic engine (nodeprep/bootstrap/engine.py).
Completion is recorded per step in ROOT/var/lib/nodeprep/bootstrap.json under a digest of the
profile: a rerun after a failure continues at the failed step, a rerun after success runs nothing
and writes nothing, a changed profile (new digest) starts over.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..digests import canonical_json, sha256_bytes
from ..errors import InputError
from ..profile import parse_profile, read_profile
from ..yamlinput import decode_text, parse_yaml
from .engine import Journal, Outcome, Report, Step, run_steps
from .steps import Context, Options, default_steps

__all__ = ["Context", "Options", "Outcome", "Report", "Step", "bootstrap", "default_steps", "describe",
           "new_warnings", "profile_digest", "summary_line"]

RECORD_FILE = Path("var/lib/nodeprep/bootstrap.json")
LOCK_FILE = Path("var/lib/nodeprep/bootstrap.lock")


def journal(root: Path) -> Journal:
    """Where bootstrap records its progress under `root`."""
    return Journal(record=root / RECORD_FILE, lock=root / LOCK_FILE, name="bootstrap")


def profile_digest(raw: bytes) -> str:
    """Digest of a profile's content: YAML parsed and canonicalised, so comments and layout don't count."""
    try:
        data: Any = parse_yaml(decode_text(raw, source="profile"), source="profile").data
    except InputError:
        data = raw.decode("utf-8", "replace")
    return sha256_bytes(canonical_json(data))


def bootstrap(
    profile_path: Path,
    *,
    root: Path = Path("/"),
    options: Options | None = None,
    restart: bool = False,
    steps: Sequence[Step] | None = None,
    on_outcome: Callable[[Outcome], None] | None = None,
) -> Report:
    """Bring up the node described by `profile_path` (a file on this machine) under `root`."""
    _, document = read_profile(profile_path)  # bounded, strict: the reader of every command
    profile = parse_profile(document.data, str(profile_path), document)
    if steps is None:
        steps = default_steps()
    digest = sha256_bytes(canonical_json(document.data))  # == profile_digest(raw) for a valid file

    def context(results: Mapping[str, Mapping[str, Any]]) -> Context:
        return Context(root=root, profile=profile, profile_path=profile_path, digest=digest,
                       options=options or Options(), results=results)

    check = bool(options and options.check)
    return run_steps(journal(root), digest, steps, context, source=str(profile_path),
                     restart=restart or check, on_outcome=on_outcome, record_run=not check)


def describe(outcome: Outcome) -> str:
    """One journal line for a step."""
    if outcome.status == "skipped":
        return f"bootstrap: {outcome.name}: already done"
    if outcome.status == "pending":
        return f"bootstrap: {outcome.name}: not run (an earlier step failed)"
    summary = outcome.result.get("summary") if outcome.result else None
    text = f"bootstrap: {outcome.name}: {outcome.status} in {outcome.seconds:.1f}s"
    if outcome.error:
        text += f": {outcome.error}"
    elif summary:
        text += f" ({summary})"
    return text


def new_warnings(outcome: Outcome, seen: set[str], *, key: str = "warnings") -> list[str]:
    """The warnings (or with `key`, e.g. "preflight", those findings) of a step run now that no
    earlier step of this run gave (the join plan repeats the runtime's); `seen` collects them. A
    step skipped as already done gives none."""
    if outcome.status != "done":
        return []
    found = [str(w) for w in outcome.result.get(key, []) if str(w) not in seen]
    seen.update(found)
    return list(dict.fromkeys(found))


def summary_line(report: Report, *, check: bool = False) -> str:
    counts: dict[str, int] = {}
    for o in report.outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    parts = ", ".join(f"{n} {s}" for s, n in counts.items())
    if check:
        verdict = "check: plan shown, nothing changed" if report.ok else "check FAILED"
        return f"bootstrap: {verdict} in {report.seconds:.1f}s ({parts.replace('done', 'planned')})"
    verdict = "node ready" if report.ok else "FAILED (rerun to resume)"
    return f"bootstrap: {verdict} in {report.seconds:.1f}s ({parts}); state {report.record_path}"
