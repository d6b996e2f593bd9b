#!/usr/bin/python
# Copyright: nodeprep maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nodeprep_unpack
short_description: Unpack the nodeprep zipapp on a node into the directory the modules import from
description:
  - Extracts the zipapp (a zip file with a shebang line) into O(dest), replacing an older tree in one
    rename, so package data files are plain files and the library imports without zipimport.
  - C(changed) is true only when O(dest) was not unpacked from a zipapp with the same sha256.
  - Needs nothing but the node's Python (no unzip tool).
version_added: "0.1.0"
options:
  src:
    description: The zipapp on the node.
    type: path
    required: true
  dest:
    description: Directory to unpack into (replaced as a whole).
    type: path
    required: true
  wrapper:
    description: Also write this shell wrapper (mode 0755) that runs the unpacked CLI; empty for none.
    type: str
    default: ""
  interpreter:
    description: Python interpreter the wrapper runs.
    type: str
    default: /usr/bin/python3
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
author:
  - nodeprep maintainers
"""

EXAMPLES = r"""
- name: Nodeprep install | Unpack the library
  nodeprep.fleet.nodeprep_unpack:
    src: /usr/local/lib/nodeprep/nodeprep.pyz
    dest: /usr/local/lib/nodeprep/lib
"""

RETURN = r"""
sha256:
  description: sha256 of the zipapp now unpacked in O(dest).
  returned: always
  type: str
"""

import os
import shutil
import zipfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.nodeprep.fleet.plugins.module_utils.nodeprep_host import (
    ZIPAPP_STAMP,
    read_stamp,
    wrapper_text,
    write_if_changed,
)


def argument_spec():
    return {
        "src": {"type": "path", "required": True},
        "dest": {"type": "path", "required": True},
        "wrapper": {"type": "str", "default": ""},
        "interpreter": {"type": "str", "default": "/usr/bin/python3"},
    }


def unpack(src, dest, digest):
    parent = os.path.dirname(dest.rstrip("/")) or "/"
    staging = os.path.join(parent, f".{os.path.basename(dest)}.new-{os.getpid()}")
    old = os.path.join(parent, f".{os.path.basename(dest)}.old-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    with zipfile.ZipFile(src) as zf:
        for name in zf.namelist():
            target = os.path.realpath(os.path.join(staging, name))
            if not target.startswith(os.path.realpath(staging) + os.sep):
                raise ValueError(f"{src}: unsafe member {name!r}")
        zf.extractall(staging)
    with open(os.path.join(staging, ZIPAPP_STAMP), "w", encoding="ascii") as f:
        f.write(digest + "\n")
    if os.path.isdir(dest):
        os.rename(dest, old)
    os.rename(staging, dest)
    shutil.rmtree(old, ignore_errors=True)


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    src, dest = module.params["src"], module.params["dest"]
    if not os.path.isfile(src):
        if module.check_mode:
            module.exit_json(changed=True, sha256=None, msg=f"{src} is not there yet")
        module.fail_json(msg=f"src: {src} does not exist")
    digest = module.sha256(src)
    before = read_stamp(dest)
    changed = before != digest
    if changed and not module.check_mode:
        try:
            unpack(src, dest, digest)
        except (OSError, ValueError, zipfile.BadZipFile) as e:
            module.fail_json(msg=f"cannot unpack {src} into {dest}: {e}")
    diffs = [{"before": {"sha256": before}, "after": {"sha256": digest}}]
    if module.params["wrapper"]:
        text = wrapper_text(module.params["interpreter"], dest)
        wrapper_changed, diff = write_if_changed(module, module.params["wrapper"], text, 0o755)
        changed |= wrapper_changed
        diffs.append(diff)
    out = {"changed": changed, "sha256": digest}
    if module._diff:
        out["diff"] = diffs
    module.exit_json(**out)


if __name__ == "__main__":
    main()
