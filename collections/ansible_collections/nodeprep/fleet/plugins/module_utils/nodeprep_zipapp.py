# Copyright: nodeprep maintainers
# Apache-2.0
"""The byte-reproducible nodeprep zipapp: what the nodeprep_zipapp action builds on the controller."""

from __future__ import annotations

import io
import os
import zipfile

EPOCH = (1980, 1, 1, 0, 0, 0)
SKIP_DIRS = {"__pycache__"}
SKIP_SUFFIXES = (".pyc", ".pyo")
MAIN = b"import sys\nfrom nodeprep.cli import main\nsys.exit(main())\n"


def argument_spec():
    return {
        "src": {"type": "path", "required": True},
        "dest": {"type": "path", "required": True},
        "vendor_dirs": {"type": "list", "elements": "path", "default": []},
        "interpreter": {"type": "str", "default": "/usr/bin/python3"},
    }


def input_problem(src, vendor_dirs):
    """One line naming the bad option, or None."""
    if not os.path.isfile(os.path.join(src, "nodeprep", "__init__.py")):
        return f"src: {src} has no nodeprep/__init__.py (expected a nodeprep source checkout)"
    for vendor in vendor_dirs:
        if not os.path.isdir(vendor):
            return f"vendor_dirs: {vendor} is not a directory"
    return None


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
