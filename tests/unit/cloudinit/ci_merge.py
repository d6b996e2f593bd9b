"""Merge cloud-init user-data the way cloud-init does (run with the distribution's python3, which has
the cloudinit package): its UserDataProcessor splits/decompresses the parts, its CloudConfigPartHandler
merges the text/cloud-config parts. Prints the merged cloud-config as JSON. Used by the tests only."""
import sys, json, tempfile
from cloudinit import helpers, user_data, util
from cloudinit.handlers.cloud_config import CloudConfigPartHandler
from cloudinit.settings import PER_ALWAYS
blob = open(sys.argv[1], 'rb').read()
tmp = tempfile.mkdtemp()
paths = helpers.Paths({"cloud_dir": tmp, "run_dir": tmp})
msg = user_data.UserDataProcessor(paths).process(blob)
h = CloudConfigPartHandler(paths)
for part in msg.walk():
    if part.is_multipart(): continue
    ctype = part.get_content_type()
    if ctype != "text/cloud-config": continue
    payload = util.decode_binary(part.get_payload(decode=True))
    h.handle_part(None, ctype, part.get_filename(), payload, PER_ALWAYS, dict(part.items()))
print(json.dumps(h.cloud_buf))
