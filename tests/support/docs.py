"""Shell blocks of the docs that tests run as written (marked `<!-- docs-example: NAME -->`)."""

from __future__ import annotations

import re

from tests.support.fixtures import REPO


def documented_block(doc: str, name: str) -> str:
    """The ```sh block right after `<!-- docs-example: NAME -->` in REPO/doc."""
    text = (REPO / doc).read_text()
    marker = f"<!-- docs-example: {name} -->"
    m = re.search(re.escape(marker) + r"\s*```sh\n(.*?)```", text, re.S)
    assert m, f"{doc}: no sh block after {marker}"
    return m.group(1)
