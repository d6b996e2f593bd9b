"""What `nodeprep runtime` and `nodeprep join` wrote, undone by `nodeprep uninstall` (join's part of
it, handed to nodeprep.node.uninstall.uninstall as `ActivationCallbacks.removal`).

The paths are the ones `nodeprep runtime` plans (plan_runtime over the node's profile,
/etc/nodeprep/node.yaml under the root; the profile defaults when there is none) and, when the
profile has a cluster, the ones `nodeprep join` plans in either cluster mode (kubeadm's
JoinConfiguration and kubelet patch; kubelet's bootstrap kubeconfig, KubeletConfiguration and systemd
drop-in, which carry the node's labels and taints), so a file runtime or join learns to write is
undone without a list kept here, plus the CDI specs nodeprep wrote in the other spec directories,
and the kubelet enablement links join's `systemctl enable` made (nodeprep.join.enablement).
What kubeadm or the kubelet made after a join (kubelet.conf, certificates) is theirs: `kubeadm reset`.
A file is removed only when nodeprep wrote it, recognised by the header every file
it writes starts with, or (a JSON file, which has no comments) by being the bytes runtime writes now;
nvidia-container-runtime's config.toml only when runtime made it from nothing (a package's file that
runtime set to CDI mode is left and named, like any other file at such a path). The containerd main file
only ever gained one `imports` entry: that entry is taken out again, and the file is written back to
the bytes it had (checked by adding the entry again, which must give the file as it is now); a file
nodeprep made from nothing (only `version = 2` and the entry) is removed.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

from .. import runner
from ..atomicfile import atomic_write, fsync_dir
from ..crash import crash_point
from ..health import unit as healthunit
from ..node import imagefile
from ..node import uninstall as node_uninstall
from ..node.callbacks import Removal, Undo
from ..node.layout import Layout
from ..profile import Profile, Runtime, load_profile, profile_path
from ..profile.fields import field_by_path
from ..runtime import cdi as cdimod
from ..runtime import containerd as ctd
from ..runtime import ctkconfig, hookprogram, ocihooks
from ..runtime.files import under
from ..runtime.plan import RuntimeOptions, plan_runtime
from . import enablement
from .joinplan import JoinOptions, plan_join
from .token import BootstrapToken

HEADER = b"# Written by nodeprep"


def _profile(root: Path) -> Profile | None:
    path = profile_path(Path(root), None)  # the image's links resolved beneath the root
    return load_profile(path) if os.path.lexists(path) else None


def _join_targets(root: Path, profile: Profile | None) -> dict[str, bool]:
    """The node paths `nodeprep join` writes, in each cluster mode (the profile's mode may have
    changed since the join), each with whether the profile's own mode writes it."""
    if profile is None or profile.cluster is None:
        return {}
    out: dict[str, bool] = {}
    options = JoinOptions(root=Path(root), check=True, discovery=False, skip_preflight=True, labels={},
                          insecure_skip_ca_verification=True, token=BootstrapToken("abcdef", "0" * 16))
    health = replace(profile.health, enabled=True)  # a health unit an earlier join wrote goes too
    for mode in field_by_path("cluster.mode").rule.schema["enum"]:
        moded = replace(profile, cluster=replace(profile.cluster, mode=mode), health=health)
        plan = plan_join(moded, options)
        out.update({f.target: out.get(f.target, False) or mode == profile.cluster.mode for f in plan.files})
    return out


def _targets(root: Path, profile: Profile | None, *,
             join: bool) -> tuple[Runtime, dict[str, bytes | None], dict[str, bool]]:
    """The runtime settings and every node path `nodeprep runtime` writes on this root, each with
    the bytes it would write now when that can be known without the profile's plan (None: unknown),
    and with `join` join's paths too (their bytes unknown: labels, token); join's alone (the
    kubelet's setup) apart, each with whether the profile's cluster mode writes it."""
    runtime = profile.runtime if profile else Runtime()
    planned: dict[str, bytes | None] = {}
    if profile is not None:
        planned = {f.target: f.content
                   for f in plan_runtime(profile, RuntimeOptions(root=Path(root), check=True)).files}
    main = runtime.containerd_config
    defaults: dict[str, bytes | None] = {
        main: None, f"{ctd.drop_in_dir(main)}/{ctd.DROP_IN_NAME}": None,
        f"{ocihooks.HOOKS_DIR}/{ocihooks.HOOK_NAME}": ocihooks.render_hooks_d(), hookprogram.HOOK_PATH: None,
        hookprogram.MODULES_PATH: None,
        ctkconfig.CONFIG: None,
        **{f"{d}/{cdimod.SPEC_NAME}": None for d in (*runtime.cdi_spec_dirs, *cdimod.SPEC_LOCATIONS)},
    }
    joins = _join_targets(root, profile) if join else {}
    kube = {t: here for t, here in joins.items() if t not in defaults and t not in planned}
    return runtime, {**defaults, **dict.fromkeys(joins), **planned}, kube


def _ours(raw: bytes) -> bool:
    """A file nodeprep wrote: its header on the first line, or on the second after a #! line (the
    hook program)."""
    lines = raw.split(b"\n", 2)
    return raw.startswith(HEADER) or (raw.startswith(b"#!") and len(lines) > 1
                                      and lines[1].startswith(HEADER))


def _import_line(entries: list[str]) -> str:
    return "imports = [" + ", ".join(json.dumps(x, ensure_ascii=False) for x in entries) + "]"


def without_import(text: str, entry: str) -> str | None:
    """`text` as it was before containerd.with_import added `entry` (with_import of the result gives
    `text` back); "" for a file with_import made from nothing; None when no such text is found (then
    the caller leaves the file)."""
    data = tomllib.loads(text) if text.strip() else {}
    imports = data.get("imports")
    if not isinstance(imports, list) or entry not in imports:
        return text
    if text == f"version = 2\n{_import_line([entry])}\n":
        return ""
    m = re.search(r"(?m)^[ \t]*imports[ \t]*=[ \t]*\[", text[: ctd._first_table(text)])
    if not m:
        return None
    end = ctd._array_end(text, m.end() - 1)
    head, tail = text[: m.start()], text[end:]
    rest = [x for x in imports if x != entry]
    if rest:
        candidates = [head + _import_line(rest) + tail]
    else:
        tail = tail.removeprefix("\n")
        candidates = [head + tail.removeprefix("\n"), head + tail, head.removesuffix("\n") + tail]
    for candidate in candidates:
        try:
            if ctd.with_import(candidate, entry) == text:
                return candidate
        except (ValueError, tomllib.TOMLDecodeError):
            continue
    return None


def plan_removal(root: Path, profile: Profile | None = None, *, join: bool = False) -> Removal:
    """What uninstall undoes of `nodeprep runtime` on `root` (nothing written here), and with `join`
    of `nodeprep join` too (`nodeprep uninstall`; the runtime module's state=absent is runtime's part
    alone); `profile`: the node's (default: /etc/nodeprep/node.yaml under `root` when there is one)."""
    runtime, targets, kube = _targets(root, profile or _profile(root), join=join)
    kubelet = set(kube)  # the paths with which join set the kubelet up
    from_nothing = ctkconfig.render_config({}, runtime)  # a config.toml runtime made, not a package's
    undo: list[Undo] = []
    kept: list[str] = []
    main = runtime.containerd_config
    seen: set[Path] = set()
    for target in targets:
        path = under(Path(root), target, follow_last=False)
        if path in seen:  # /var/run/cdi and /run/cdi: one folder
            continue
        seen.add(path)
        if path.is_symlink() or not path.is_file():
            if path.is_symlink() or path.exists():
                kept.append(f"{target}: not a regular file nodeprep wrote; left in place")
            continue
        raw = imagefile.read(path, limit=imagefile.MAX_LIST, what="a file nodeprep runtime or join writes")
        if raw is None:
            continue
        if target == main:
            text = raw.decode("utf-8", "replace")
            before = without_import(text, ctd.import_entry(main))
            if before is None:
                kept.append(f"{target}: its imports entry {ctd.import_entry(main)} could not be taken out "
                            "without changing other settings; left in place")
            elif before != text:
                undo.append(Undo(target, path, before.encode() if before else None,
                                 path.stat().st_mode & 0o7777))
        elif target == ctkconfig.CONFIG:
            if raw == from_nothing:
                undo.append(Undo(target, path))
            else:
                kept.append(f"{target}: nodeprep set its CDI mode in a file it did not create; left in place")
        elif _ours(raw) or raw == targets[target]:  # a JSON file has no header
            undo.append(Undo(target, path))
        elif kube.get(target):  # join's files had no header before 2026-11-26: the operator decides
            kept.append(f"{target}: no '{HEADER.decode()}' header, so not known as nodeprep's and left in "
                        f"place; if an older nodeprep join wrote it, remove it by hand: rm {target}")
        else:
            kept.append(f"{target}: not written by nodeprep; left in place")
    paths = {*targets, *(Layout(Path(root)).node_path(p) for p in seen)}
    if join:
        enabled, not_ours = enablement.plan_undo(root)
        undo += enabled
        kept += not_ours
        kubelet |= {u.target for u in enabled}
        paths |= {enablement.record_target(root)[1], *(u.target for u in enabled)}
    restart = ("containerd.service",) if any("containerd" in u.target for u in undo) else ()
    stop = (enablement.UNIT,) if any(u.target in kubelet for u in undo) else ()
    if any(u.target == healthunit.UNIT_PATH for u in undo):  # its unit goes: the service stops first
        stop = (healthunit.UNIT, *stop)
    return Removal(undo=tuple(undo), kept=tuple(kept), restart=restart, stop=stop,
                   paths=tuple(sorted(paths)))


def apply_removal(removal: Removal, *, root: Path, live: bool, check: bool = False) -> dict[str, Any]:
    """Undo `removal` on `root` (the Ansible runtime and join modules' state=absent; `nodeprep
    uninstall` does it with the rest): on a live root the units join set up stopped when active
    (nodeprep.node.uninstall.stop_active), files removed or written back, then the folders left empty
    (uninstall's rule and journal, nodeprep.node.uninstall.removal_folders), then on a live root the units
    restarted.
    `check`: what it would do, nothing done."""
    layout = Layout(Path(root))
    deleted = [u.target for u in removal.undo if u.content is None]
    # noted first: a killed run's are finished next time
    folders = node_uninstall.removal_folders(layout, deleted, removal.paths)
    stop = [["systemctl", "stop", unit] for unit in removal.stop] if live else []  # when active
    ran = [["systemctl", "try-restart", unit] for unit in removal.restart] if live and removal.undo else []
    notes: list[str] = []
    if not check:
        node_uninstall.journal_folders(layout, folders)
        stop, notes = node_uninstall.stop_active(removal.stop) if live else ([], [])
        for u in removal.undo:
            if u.content is None:
                u.path.unlink(missing_ok=True)
                fsync_dir(u.path.parent)
            else:
                atomic_write(u.path, u.content, mode=u.mode)
        crash_point("removal:files")
        for folder in folders:
            node_uninstall.remove_empty_folder(layout, folder)
        node_uninstall.journal_folders(layout, [])
        for argv in ran:
            runner.run(argv, timeout=300, check=False)
    return {"changed": bool(removal.undo or folders), "removed": [*deleted, *folders],
            "restored": [u.target for u in removal.undo if u.content is not None],
            "ran": stop + ran, "kept": list(removal.kept), "notes": notes}
