"""Every file derived from the profile's field table (nodeprep/profile/fields.py) holds what the one
generator writes: the schema, docs/profile.md's table, examples/node.yaml's driver section and the
Ansible files that cannot import nodeprep. A field added to the table alone fails here, naming the
command that rewrites them. Nothing GPU-like is used."""

from __future__ import annotations

import yaml

from nodeprep.profile.fields import FIELDS
from nodeprep.profile.generate import COMMAND, REGIONS, REPO, derived, installed, stale


def test_no_derived_file_is_stale() -> None:
    old = [str(path.relative_to(REPO)) for path in stale()]
    assert old == [], f"stale (derived from nodeprep/profile/fields.py): {', '.join(old)}; run `{COMMAND}`"


def test_the_derived_yaml_is_yaml_and_names_every_installed_field() -> None:
    """The generated regions parse, and each driver field the Ansible side takes is in each of them."""
    texts = {str(path.relative_to(REPO)): text for path, text in derived().items()}
    for name in REGIONS:
        if name.endswith((".yml", ".yaml")):
            yaml.safe_load(texts[name])
    for f in installed():
        for name in REGIONS:
            if "nvidia_driver" in name or "nodeprep_driver" in name or "nodeprep_op_driver" in name:
                assert f.key in texts[name], (f.path, name)
    for f in FIELDS:
        assert f"| `{f.path}` |" in texts["docs/profile.md"], f.path
