"""Merge cloud-init user-data the way cloud-init does (run with the distribution's python3, which has
the cloudinit package): its UserDataProcessor splits/decompresses the parts, its CloudConfigPartHandler
merges the text/cloud-config parts. Prints the merged cloud-config as JSON. Used by the tests only
(tests/unit/cloudinit, and imported by tests/slow/bootstrap/ci_apply.py).

    /usr/bin/python3 ci_merge.py USER_DATA
"""

import json
import sys
import tempfile

from cloudinit import helpers, user_data, util
from cloudinit.handlers.cloud_config import CloudConfigPartHandler
from cloudinit.settings import PER_ALWAYS


def merged_config(blob):
    """The merged cloud-config of the user-data `blob` (None where it has no cloud-config part)."""
    tmp = tempfile.mkdtemp()
    paths = helpers.Paths({"cloud_dir": tmp, "run_dir": tmp})
    msg = user_data.UserDataProcessor(paths).process(blob)
    handler = CloudConfigPartHandler(paths)
    for part in msg.walk():
        if part.is_multipart() or part.get_content_type() != "text/cloud-config":
            continue
        payload = util.decode_binary(part.get_payload(decode=True))
        handler.handle_part(None, "text/cloud-config", part.get_filename(), payload, PER_ALWAYS,
                            dict(part.items()))
    return handler.cloud_buf


def main():
    with open(sys.argv[1], "rb") as f:
        print(json.dumps(merged_config(f.read())))


if __name__ == "__main__":
    main()
