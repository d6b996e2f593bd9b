"""Apply cloud-init user-data to a root directory with cloud-init's own code (run with the
distribution's python3, which has the cloudinit package):

    python3 ci_apply.py USER_DATA ROOT OUT_JSON

- the user-data (plain, gzip, MIME) is split and merged by cloud-init's UserDataProcessor and
  CloudConfigPartHandler, exactly as on a booted instance;
- write_files entries (not deferred, then deferred) are written by cloudinit.config.cc_write_files.
  write_files with each path moved under ROOT (the one change: cloud-init writes to /);
- runcmd is turned into the script cloud-init would run (cloudinit.util.shellify), written to
  ROOT/var/lib/cloud/instance/scripts/runcmd, and returned in OUT_JSON with the merged config, so
  the caller runs the commands (in a chroot, or translated to --root) itself.
"""

import json
import os
import sys

from cloudinit import util
from cloudinit.config import cc_write_files

# the merge is tests/support/ci_merge.py's (the fast cloud-init tests run it as a script)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "support"))
from ci_merge import merged_config  # noqa: E402


def main():
    blob_path, root, out = sys.argv[1:4]
    with open(blob_path, "rb") as f:
        cfg = merged_config(f.read()) or {}
    files = cfg.get("write_files") or []
    rooted = []
    for f in files:
        entry = dict(f)
        entry["path"] = os.path.join(root, os.path.abspath(f["path"]).lstrip("/"))
        rooted.append(entry)
    now = [f for f in rooted if not f.get("defer")]
    later = [f for f in rooted if f.get("defer")]
    cc_write_files.write_files("write_files", now, "root:root")
    cc_write_files.write_files("write_files_deferred", later, "root:root")
    script = None
    if cfg.get("runcmd"):
        script = util.shellify(cfg["runcmd"])
        util.write_file(os.path.join(root, "var/lib/cloud/instance/scripts/runcmd"), script, 0o700)
    with open(out, "w") as f:
        json.dump({"config": cfg, "runcmd_script": script}, f)


if __name__ == "__main__":
    main()
