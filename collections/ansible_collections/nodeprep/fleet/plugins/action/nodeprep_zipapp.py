# Copyright: nodeprep maintainers
# Apache-2.0
"""nodeprep_zipapp runs in the controller's worker process: no module is sent anywhere.

As a module it cost a local Python start plus AnsiballZ on every playbook run (~0.3 s, the largest
single item of a no-change re-run); as an action it is the zip build and one hash.
"""

from __future__ import annotations

import hashlib
import os
import tempfile

from ansible.plugins.action import ActionBase
from ansible_collections.nodeprep.fleet.plugins.module_utils.nodeprep_zipapp import (
    argument_spec,
    build,
    input_problem,
)


def _sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_atomically(dest, data):
    """dest gets data (mode 0755) or keeps its old bytes: a temporary beside it, then rename.

    Not nodeprep.atomicfile.atomic_write: this runs on the controller, where nodeprep is the source
    tree being packed, not a library this Python can import. The temporary starts at mkstemp's 0600
    (never wider than the 0755 asked for; the zipapp holds no secret)."""
    directory = os.path.dirname(dest) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".nodeprep.pyz.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest)
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False  # all of it happens on the controller
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec=argument_spec())
        src, dest = args["src"], args["dest"]
        problem = input_problem(src, args["vendor_dirs"])
        if problem:
            result.update(failed=True, msg=problem)
            return result
        data, count = build(src, args["vendor_dirs"], args["interpreter"])
        new = hashlib.sha256(data).hexdigest()
        old = _sha256_file(dest) if os.path.exists(dest) else None
        result.update(dest=dest, sha256=new, members=count, changed=old != new)
        if self._task.diff:
            result["diff"] = {"before": {"sha256": old}, "after": {"sha256": new}}
        if result["changed"] and not self._task.check_mode:
            _write_atomically(dest, data)
        return result
