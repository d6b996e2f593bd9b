"""docs/design-decisions.md's index lists every record heading, in order, with a working anchor."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "design-decisions.md"


def _anchor(title: str) -> str:
    """The anchor a Markdown renderer gives a heading (lower case, punctuation dropped)."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def test_the_index_lists_every_record_heading_in_order() -> None:
    text = DOC.read_text(encoding="utf-8")
    head, changes = text.split("## Changes and refinements to the design", 1)
    headings = re.findall(r"^### (.+)$", changes, re.M)
    index = re.findall(r"^- \[(.+)\]\(#([^)]+)\)$", head.split("## Index", 1)[1], re.M)
    assert headings, "no record headings found"
    assert [t for t, _ in index] == headings, "index and headings differ: regenerate the index"
    assert [a for _, a in index] == [_anchor(t) for t in headings]
