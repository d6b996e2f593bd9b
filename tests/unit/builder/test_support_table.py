"""docs/build.md's support table (generated from the slow tier's records, tests/support/supporttable.py):
its shape, and that each row names what tests/support/realbuild.py CELLS pins. The values themselves
are checked against real builds and smoke boots by tests/slow/smoke/test_smoke_cells.py."""

from __future__ import annotations

from tests.support import supporttable
from tests.support.realbuild import CELLS, OPEN_SOURCE_CELLS


def test_doc_table_has_one_smoke_tested_row_per_cell() -> None:
    rows = supporttable.parse(supporttable.doc_table(supporttable.DOC.read_text()))
    tabled = [c for c in supporttable.CELL_ORDER if c in OPEN_SOURCE_CELLS]
    assert len(rows) == len(supporttable.CELL_ORDER) == len(CELLS) + 1 + len(tabled)
    assert all(r["smoke test"] == "PASS" for r in rows), rows
    by_cell = dict(zip(supporttable.CELL_ORDER, rows, strict=True))
    for name, cell in CELLS.items():
        row = by_cell[name]
        assert row["OS"].split()[0] == cell["os_name"], row
        assert row["kernel"] == cell["kernel"] and row["flavour"] == cell["flavour"], row
        assert row["driver"].split()[0] == cell["driver"], row
    for name in tabled:
        row, cell = by_cell[name], OPEN_SOURCE_CELLS[name]
        assert (row["OS"].split()[0], row["kernel"], row["flavour"]) == (
            cell["os_name"], cell["kernel"], "open")
        assert row["driver"] == f"{cell['release']} (NVIDIA release)", row
    assert by_cell["debian12-backports"]["OS"] == "debian-12 (backports)"
    assert "~bpo12" in by_cell["debian12-backports"]["driver"]


def test_render_parse_and_replace_round_trip() -> None:
    row = dict.fromkeys(supporttable.COLUMNS, "x") | {"kernel": "6.12.94+deb13-amd64"}
    table = supporttable.render([row])
    text = f"intro\n{supporttable.BEGIN}\nold\n{supporttable.END}\nrest\n"
    new = supporttable.replace_table(text, table)
    assert new.startswith("intro\n") and new.endswith(f"{supporttable.END}\nrest\n")
    assert supporttable.parse(supporttable.doc_table(new)) == [row]
    assert supporttable.checked([row]) == [{k: v for k, v in row.items() if k != "build time"}]
