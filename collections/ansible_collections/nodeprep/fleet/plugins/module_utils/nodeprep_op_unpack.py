# Copyright: nodeprep maintainers
# Apache-2.0
"""What nodeprep.fleet.nodeprep_unpack does on the node (its documentation is in
plugins/modules/nodeprep_unpack.py). Its entry point is main()."""

from __future__ import annotations

import os
import shutil
import sys
import zipfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.nodeprep.fleet.plugins.module_utils import nodeprep_host as host


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
    with open(os.path.join(staging, host.ZIPAPP_STAMP), "w", encoding="ascii") as f:
        f.write(digest + "\n")
    if os.path.isdir(dest):
        os.rename(dest, old)
    os.rename(staging, dest)
    shutil.rmtree(old, ignore_errors=True)


def run(module):
    """The nodeprep_unpack task on a validated AnsibleModule (see modules/nodeprep_unpack.py)."""
    src, dest = module.params["src"], module.params["dest"]
    if not os.path.isfile(src):
        if module.check_mode:
            module.exit_json(changed=True, sha256=None, msg=f"{src} is not there yet")
        module.fail_json(msg=f"src: {src} does not exist")
    digest = module.sha256(src)
    before = host.read_stamp(dest)
    changed = before != digest
    if changed and not module.check_mode:
        try:
            unpack(src, dest, digest)
        except (OSError, ValueError, zipfile.BadZipFile) as e:
            module.fail_json(msg=f"cannot unpack {src} into {dest}: {e}")
    diffs = [{"before": {"sha256": before}, "after": {"sha256": digest}}]
    if module.params["wrapper"]:
        if not module.check_mode and dest not in sys.path:
            sys.path.insert(0, dest)  # the library just unpacked writes the wrapper (write_if_changed)
        text = host.wrapper_text(module.params["interpreter"], dest)
        wrapper_changed, diff = host.write_if_changed(module, module.params["wrapper"], text, 0o755)
        changed |= wrapper_changed
        diffs.append(diff)
    out = {"changed": changed, "sha256": digest}
    host.exit_with(module, out, diffs)


def main():
    run(AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True))
