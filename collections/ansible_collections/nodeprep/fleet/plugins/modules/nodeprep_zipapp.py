#!/usr/bin/python
# Copyright: nodeprep maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nodeprep_zipapp
short_description: Build nodeprep as a single-file, byte-reproducible zipapp
description:
  - Packs the C(nodeprep) Python package (and optionally vendored pure-Python dependencies) into
    a zipapp with fixed timestamps and sorted members, so the same sources give the same bytes.
  - Runs on the controller (delegated to localhost); the result is copied to nodes by the
    C(nodeprep_install) role.
  - C(changed) is true only when the zipapp at O(dest) did not exist or had different bytes.
version_added: "0.1.0"
options:
  src:
    description: Directory that contains the C(nodeprep) package directory (a source checkout).
    type: path
    required: true
  dest:
    description: Where to write the zipapp.
    type: path
    required: true
  vendor_dirs:
    description:
      - Directories of extra pure-Python packages to include (for example the output of
        C(pip install --target DIR PKG)). Their top-level entries are added beside C(nodeprep).
    type: list
    elements: path
    default: []
  interpreter:
    description: Interpreter written into the zipapp's shebang line.
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
- name: Nodeprep | Build the zipapp on the controller
  nodeprep.fleet.nodeprep_zipapp:
    src: "{{ playbook_dir }}/.."
    dest: /var/cache/nodeprep/nodeprep.pyz
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
dest:
  description: Path of the zipapp.
  returned: always
  type: str
  sample: /var/cache/nodeprep/nodeprep.pyz
sha256:
  description: sha256 of the zipapp that is (or in check mode would be) at O(dest).
  returned: always
  type: str
  sample: 5b1e...
members:
  description: Number of files packed.
  returned: always
  type: int
  sample: 42
"""

import hashlib
import io
import os
import zipfile

from ansible.module_utils.basic import AnsibleModule

EPOCH = (1980, 1, 1, 0, 0, 0)
SKIP_DIRS = {"__pycache__"}
SKIP_SUFFIXES = (".pyc", ".pyo")
MAIN = b"import sys\nfrom nodeprep.cli import main\nsys.exit(main())\n"


def collect(top, prefix):
    """(archive name, file path) pairs under top, sorted, without caches."""
    found = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".dist-info"))
        for name in filenames:
            if name.endswith(SKIP_SUFFIXES):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, top).replace(os.sep, "/")
            found.append((prefix + rel, path))
    return found


def build(src, vendor_dirs, interpreter):
    """Return (zipapp bytes, member count)."""
    members = collect(os.path.join(src, "nodeprep"), "nodeprep/")
    for vendor in vendor_dirs:
        members.extend(collect(vendor, ""))
    members.sort()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        info = zipfile.ZipInfo("__main__.py", date_time=EPOCH)
        info.external_attr = 0o644 << 16
        zf.writestr(info, MAIN)
        for name, path in members:
            info = zipfile.ZipInfo(name, date_time=EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            with open(path, "rb") as f:
                zf.writestr(info, f.read())
    return b"#!" + interpreter.encode() + b"\n" + buf.getvalue(), len(members) + 1


def argument_spec():
    return {
        "src": {"type": "path", "required": True},
        "dest": {"type": "path", "required": True},
        "vendor_dirs": {"type": "list", "elements": "path", "default": []},
        "interpreter": {"type": "str", "default": "/usr/bin/python3"},
    }


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    src, dest = module.params["src"], module.params["dest"]
    if not os.path.isfile(os.path.join(src, "nodeprep", "__init__.py")):
        module.fail_json(msg=f"src: {src} has no nodeprep/__init__.py (expected a nodeprep source checkout)")
    for vendor in module.params["vendor_dirs"]:
        if not os.path.isdir(vendor):
            module.fail_json(msg=f"vendor_dirs: {vendor} is not a directory")
    data, count = build(src, module.params["vendor_dirs"], module.params["interpreter"])
    new = hashlib.sha256(data).hexdigest()
    old = module.sha256(dest) if os.path.exists(dest) else None
    result = {"dest": dest, "sha256": new, "members": count, "changed": old != new}
    if module._diff:
        result["diff"] = {"before": {"sha256": old}, "after": {"sha256": new}}
    if result["changed"] and not module.check_mode:
        os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
        tmp = os.path.join(module.tmpdir, "nodeprep.pyz")
        with open(tmp, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o755)
        module.atomic_move(tmp, dest)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
