"""nodeprep.join.removal.without_import: the containerd main file written back to the bytes it had
before `nodeprep runtime` added its imports entry (containerd.with_import), for the shapes a main
file comes in."""

from __future__ import annotations

import pytest

from nodeprep.join.removal import without_import
from nodeprep.runtime.containerd import import_entry, with_import

ENTRY = import_entry("/etc/containerd/config.toml")
TABLE = '[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "pause:3.9"\n'


@pytest.mark.parametrize("before", [
    "version = 2\n\n" + TABLE,
    "version = 2\n" + TABLE,
    "# containerd, by the admin\nversion = 2\n\n" + TABLE,
    TABLE,
    'version = 2\nimports = ["/etc/containerd/other.toml"]\n\n' + TABLE,
    "version = 3\n\n" + TABLE + "\n# trailing comment\n",
], ids=["blank-before-table", "no-blank", "comment", "v1-table-only", "other-import", "v3"])
def test_the_main_file_gets_its_bytes_back(before: str) -> None:
    after = with_import(before, ENTRY)
    assert after != before
    assert without_import(after, ENTRY) == before


def test_a_file_made_from_nothing_is_removed() -> None:
    """A missing or empty main file gets `version = 2` and the entry; so does one that held only
    `version = 2` (the same bytes): the file is removed (docs/node.md, "Uninstall")."""
    assert without_import(with_import("", ENTRY), ENTRY) == ""
    assert with_import("version = 2\n", ENTRY) == with_import("", ENTRY)


def test_a_file_without_the_entry_is_left_as_it_is() -> None:
    assert without_import("version = 2\n" + TABLE, ENTRY) == "version = 2\n" + TABLE
